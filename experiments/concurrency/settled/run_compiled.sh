#!/bin/bash
# Compiled concurrency 4, 16 and 64 with the final code (after the calibration's spread), after a
# warm-up that builds their graphs and calibrations.
# usage: bash experiments/concurrency/settled/run_compiled.sh   (MTPX_DATA_DIR: ../shared/data by default)
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1 MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/settled/matrix/spread W=/tmp/settled_compiled_warmup
mkdir -p $W
for c in "4 plain mtp4 mtp8 auto" "16 plain mtp4 auto" "64 plain mtp1 mtp4 auto"; do
  set -- $c; n=$1; shift
  python tools/bench_speedup.py --compile --concurrency $n --rounds 1 --num-prompts 4 --max-tokens 8 --threads 1 \
    --contenders "$@" --out $W/c$n > $W/c$n.log 2>&1
done
bash experiments/concurrency/matrix.sh $OUT c4c c16c c64c
