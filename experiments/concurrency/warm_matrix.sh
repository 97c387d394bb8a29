#!/bin/bash
# Issue 37's matrix with no graph built in a measured chunk: a warm-up of the compiled cells on 4
# prompts each (into WARM, not kept) builds and saves every graph and step-cost calibration of
# this source, then every cell once (matrix.sh).
# usage: bash experiments/concurrency/warm_matrix.sh OUT WARM   (MTPX_DATA_DIR: ../shared/data by default)
cd "$(dirname "$0")/../.."
OUT=$1 W=$2
export OMP_NUM_THREADS=1 MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
mkdir -p $W
for c in "1 plain mtp4 mtp8 auto" "4 plain mtp4 mtp8 auto" "16 plain mtp4 auto" "64 plain mtp1 mtp4 auto"; do
  set -- $c; n=$1; shift
  python tools/bench_speedup.py --compile --concurrency $n --rounds 1 --num-prompts 4 --max-tokens 8 --threads 1 \
    --contenders "$@" --out $W/c$n > $W/c$n.log 2>&1
done
bash experiments/concurrency/matrix.sh $OUT c1c c4c c16c c64c c1 c4 c16 c64
