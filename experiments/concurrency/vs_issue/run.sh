#!/bin/bash
# Issue 37's "must show" against the issue's own commit (08e9920, in a worktree), alternated as
# processes on this machine: concurrency 64 (the issue's settings: 128 GSM8K test prompts, 128
# tokens, 2 chunks of 64; plain and mtp4, its best contenders) and concurrency 1 (plain and mtp8;
# the first 32 prompts in 2 chunks: the issue commit's eager plain step takes minutes per 128),
# eager and compiled; 1 thread; logs beside this script.
# usage: bash experiments/concurrency/vs_issue/run.sh [c64 c64c c1 c1c]   (default: all)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/vs_issue
BASE=/tmp/mtpx_08e9920
[ -d $BASE ] || git worktree add --detach $BASE 08e9920
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
side() { [ $1 = issue ] && echo $BASE || pwd; }
# runs NAME "SIDE:N ..." ARGS...: tools/bench_speedup.py from each side in turn (its own copy)
runs() {
  local name=$1 order=$2; shift 2
  for run in $order; do
    local s=${run%:*} n=${run#*:}
    (cd $(side $s) && python tools/bench_speedup.py "$@" --threads 1 --max-tokens 128 --out $OLDPWD/$OUT/${name}_${s}_$n) > $OUT/${name}_${s}_$n.log 2>&1
    date >> $OUT/${name}_${s}_$n.log
  done
}
C64="--concurrency 64 --num-prompts 128 --rounds 2 --contenders plain mtp4"
C1="--concurrency 1 --num-prompts 32 --rounds 2 --contenders plain mtp8"
stage c64 && runs eager_c64 "issue:1 now:1" $C64
stage c64c && runs compiled_c64 "issue:1 now:1" $C64 --compile
stage c1 && runs eager_c1 "issue:1 now:1" $C1
stage c1c && runs compiled_c1 "issue:1 now:1" $C1 --compile
true
