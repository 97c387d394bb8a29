#!/bin/bash
# The issue's must-show: GSM8K test, 128 prompts, greedy, at most 256 tokens, concurrency 1,
# compiled (engine.compile; every engine compiles and warms up before anything is timed).
set -e
cd "$(dirname "$0")/../.."
python tools/bench_speedup.py --num-prompts 128 --max-tokens 256 --rounds 4 --compile --threads 2 \
  --contenders plain mtp1 mtp8 --out experiments/speedup_gsm8k/compiled
