#!/bin/bash
# num_speculative_tokens=auto against plain decoding and fixed k of multi-module MTP, eager, fp32,
# GSM8K test prompts, at most 128 tokens, concurrency 1, 4, 16 and 64 (one process per
# concurrency; the contenders alternate per chunk inside it, in a rotated order). Nothing else
# may run on the machine meanwhile. Then the cost model against the measurement (predict.py).
# Usage: bash experiments/auto_k/run.sh [OUT]   (OUT: where conc*/ go, default experiments/auto_k)
set -e
cd "$(dirname "$0")/../.."
OUT=${1:-experiments/auto_k}
# A fresh step-cost cache: auto calibrates at start-up, as on a machine's first run.
export MTPX_CACHE_DIR=$(mktemp -d)
# Concurrency 16 and 64 have more chunks (one wave of requests each) and no mtp8:1, which never
# wins there: the machine's noise between chunks is about 20%.
for conc_prompts_rounds in "1 32 4" "4 64 8" "16 128 8" "64 256 4"; do
  set -- $conc_prompts_rounds
  C="plain mtp8:1 mtp2 mtp4 mtp8 auto"
  [ "$1" -ge 16 ] && C="plain mtp2 mtp4 mtp8 auto"
  python tools/bench_speedup.py --num-prompts $2 --max-tokens 128 --rounds $3 --concurrency $1 \
    --contenders $C --threads 2 --out $OUT/conc$1
done
python experiments/auto_k/predict.py $OUT/conc{1,4,16,64}/speedup.json > $OUT/predicted.md
