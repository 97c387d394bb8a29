#!/usr/bin/env bash
# Issue 37's matrix: output tok/s of plain decoding, every fixed k and automatic k, side by side in
# one process per (concurrency, mode), GSM8K test prompts, greedy, at most 128 tokens.
# Run from the repository root on an otherwise idle machine: bash experiments/concurrency/run.sh
set -euo pipefail
OUT=experiments/concurrency
C="plain mtp1 mtp4 mtp8 auto"
# eager; concurrency 1 and 4 on fewer prompts (128 prompts at concurrency 1 take about 40 minutes)
python tools/bench_speedup.py --concurrency 64 --num-prompts 128 --rounds 2 --max-tokens 128 --threads 2 --contenders $C --out $OUT/eager_c64
python tools/bench_speedup.py --concurrency 16 --num-prompts 128 --rounds 2 --max-tokens 128 --threads 2 --contenders $C --out $OUT/eager_c16
python tools/bench_speedup.py --concurrency 4 --num-prompts 64 --rounds 2 --max-tokens 128 --threads 2 --contenders $C --out $OUT/eager_c4
python tools/bench_speedup.py --concurrency 1 --num-prompts 16 --rounds 2 --max-tokens 128 --threads 2 --contenders $C --out $OUT/eager_c1
