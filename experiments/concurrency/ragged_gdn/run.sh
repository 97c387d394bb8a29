#!/bin/bash
# Per-request k (engine.per_request_k) once the Gated DeltaNet window kernel skips padding tokens:
# the code before that change (2959c38, in a worktree) and after, alternated as processes, each
# running plain, mtp4, auto and auto with per-request k side by side; eager, 1 thread, GSM8K test.
# usage: bash experiments/concurrency/ragged_gdn/run.sh [c16 c4]   (default: both)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/ragged_gdn
BASE=/tmp/mtpx_2959c38
[ -d $BASE ] || git worktree add --detach $BASE 2959c38
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
STAGES="${*:-c16 c4}"
A="--max-tokens 128 --threads 1 --num-prompts 128 --rounds 4 --contenders plain mtp4 auto auto+per_request_k=true"
for c in $STAGES; do
  for side in before after; do
    dir=$([ $side = before ] && echo $BASE || pwd)
    (cd $dir && python tools/bench_speedup.py --concurrency ${c#c} $A --out $OLDPWD/$OUT/${side}_$c) > $OUT/${side}_$c.log 2>&1
  done
done
true
