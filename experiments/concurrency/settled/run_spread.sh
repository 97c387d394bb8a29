#!/bin/bash
# Concurrency 1 after the calibration's passes span 10 s (eager, then compiled after a warm-up
# of its graphs), in 4 chunks of 32 prompts and in 16 of 8; then eager concurrency 4, 16 and 64.
# usage: bash experiments/concurrency/settled/run_spread.sh   (MTPX_DATA_DIR: ../shared/data by default)
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1 MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/settled/matrix/spread W=/tmp/settled_spread_warmup
mkdir -p $W
bash experiments/concurrency/matrix.sh $OUT c1 c1e16
python tools/bench_speedup.py --compile --concurrency 1 --rounds 1 --num-prompts 4 --max-tokens 8 --threads 1 \
  --contenders plain mtp4 mtp8 auto --out $W/c1 > $W/c1.log 2>&1
bash experiments/concurrency/matrix.sh $OUT c1c c1c16
bash experiments/concurrency/matrix.sh $OUT c4 c16 c64
