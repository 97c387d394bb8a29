#!/bin/bash
# Issue 37 item 3: the decode step against its matmul floor before (BASE, default 75e7db9, in a
# worktree) and after this folder's kernel changes, alternated as processes, 1 thread; the
# kernels alone (before against after in one process each); end to end at concurrency 64 and 1.
# usage: bash experiments/lean_step/floor_2x/run.sh [STAGES...]   (floor kernels c64 c1 c1c; default: all)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/lean_step/floor_2x
BASE=${BASE:-/tmp/mtpx_75e7db9}
[ -d $BASE ] || git worktree add --detach $BASE 75e7db9
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
side() { [ $1 = before ] && echo $BASE || pwd; }
# floor: tools/bench_floor.py (unchanged since 75e7db9), eager, two runs each side, alternated
F="--batch-sizes 16 64 --cases plain mtp8:4 --threads 1 --pairs 10"
if stage floor; then
  for i in 1 2; do
    for s in before after; do
      (cd $(side $s) && python tools/bench_floor.py $F --out $OLDPWD/$OUT/floor_${s}_$i.json) > $OUT/floor_${s}_$i.txt 2>&1
    done
  done
fi
# kernels: the C kernels alone, before (BASE's source) against after in one process, alternated
if stage kernels; then
  for T in 1 5; do
    for shuffle in 1 0; do
      python $OUT/attn_ab.py $BASE/mtpx/kernels/paged_attention.c mtpx/kernels/paged_attention.c $T $shuffle >> $OUT/kernels.txt 2>&1
    done
  done
  for L in 1 24; do
    python $OUT/gdn_ab.py $BASE/mtpx/kernels/gdn_decode.c mtpx/kernels/gdn_decode.c $L 1 >> $OUT/kernels.txt 2>&1
  done
fi
# end to end (tools/bench_speedup.py, GSM8K test, 128 tokens, 1 thread), each side's own copy,
# alternated as processes: concurrency 64 (the issue's settings: 128 prompts, 2 chunks of 64; plain
# and mtp4) and concurrency 1 (the first 32 prompts in 2 chunks; plain and mtp8), eager and compiled
# runs NAME ARGS...: before, after, before, after
runs() {
  local name=$1; shift
  for run in before:1 after:1 before:2 after:2; do
    local s=${run%:*} n=${run#*:}
    (cd $(side $s) && python tools/bench_speedup.py "$@" --threads 1 --max-tokens 128 --out $OLDPWD/$OUT/${name}_${s}_$n) > $OUT/${name}_${s}_$n.log 2>&1
  done
}
C64="--concurrency 64 --num-prompts 128 --rounds 2 --contenders plain mtp4"
C1="--concurrency 1 --num-prompts 32 --rounds 2 --contenders plain mtp8"
stage c64 && runs c64 $C64
stage c1 && runs c1 $C1
stage c1c && runs c1_compiled $C1 --compile
true
