#!/bin/bash
# num_speculative_tokens=auto against plain decoding and fixed k of multi-module MTP, eager, fp32,
# GSM8K test prompts, concurrency 1, 4, 16 and 64 (one process per concurrency; contenders
# alternated per chunk inside it). Nothing else may run on the machine meanwhile.
set -e
cd "$(dirname "$0")/../.."
C="plain mtp8:1 mtp2 mtp4 mtp8 auto"
for conc_prompts in "1 16" "4 32" "16 64" "64 128"; do
  set -- $conc_prompts
  python tools/bench_speedup.py --num-prompts $2 --max-tokens 128 --rounds 2 --concurrency $1 \
    --contenders $C --threads 2 --out experiments/auto_k/conc$1
done
