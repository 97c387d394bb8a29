#!/usr/bin/env bash
# Issue 37 after the CPU kernels: GSM8K test, greedy, 128 tokens, 1 thread, the contenders side by
# side in one process per (concurrency, mode). Concurrency 64 eager is alternated with the issue's
# commit (08e9920: plain and mtp4, the issue's "today"), then this commit compiled at 64, then
# eager and compiled at 16, 4 and 1.
# usage: bash experiments/concurrency/kernels/run.sh [STAGES...]   (default: all)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/kernels
mkdir -p $OUT
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
A="--rounds 2 --max-tokens 128 --threads 1"
B="python tools/bench_speedup.py"
if [ ! -d /tmp/mtpx_08e9920 ]; then git worktree add --detach /tmp/mtpx_08e9920 08e9920; fi
old() {  # old NAME ARGS...: tools/bench_speedup.py of the issue's commit
  local name=$1; shift
  (cd /tmp/mtpx_08e9920 && python tools/bench_speedup.py "$@" --out $OLDPWD/$OUT/$name) > $OUT/$name.log 2>&1
}
stage() { [ $# -eq 0 ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
if stage c64; then
  old before_08e9920_c64_1 --concurrency 64 --num-prompts 128 $A --contenders plain mtp4
  $B --concurrency 64 --num-prompts 128 $A --contenders plain mtp1 mtp4 auto --out $OUT/eager_c64 > $OUT/eager_c64.log 2>&1
  old before_08e9920_c64_2 --concurrency 64 --num-prompts 128 $A --contenders plain mtp4
  $B --compile --concurrency 64 --num-prompts 128 $A --contenders plain mtp1 mtp4 auto --out $OUT/compiled_c64 > $OUT/compiled_c64.log 2>&1
fi
if stage c16; then
  $B --concurrency 16 --num-prompts 128 $A --contenders plain mtp1 mtp4 auto --out $OUT/eager_c16 > $OUT/eager_c16.log 2>&1
  $B --compile --concurrency 16 --num-prompts 128 $A --contenders plain mtp4 auto --out $OUT/compiled_c16 > $OUT/compiled_c16.log 2>&1
fi
if stage c4; then
  $B --concurrency 4 --num-prompts 32 $A --contenders plain mtp4 mtp8 auto --out $OUT/eager_c4 > $OUT/eager_c4.log 2>&1
  $B --compile --concurrency 4 --num-prompts 32 $A --contenders plain mtp4 mtp8 auto --out $OUT/compiled_c4 > $OUT/compiled_c4.log 2>&1
fi
if stage c1; then
  $B --concurrency 1 --num-prompts 16 $A --contenders plain mtp8 auto --out $OUT/eager_c1 > $OUT/eager_c1.log 2>&1
  $B --compile --concurrency 1 --num-prompts 16 $A --contenders plain mtp8 auto --out $OUT/compiled_c1 > $OUT/compiled_c1.log 2>&1
fi
