#!/bin/bash
# Issue 37 item 3: the batch step against its matmul floor before (195dcfd, in a worktree) and
# after this folder's kernel changes, alternated as processes; 1 thread; logs beside this script.
# usage: bash experiments/lean_step/prefetch/run.sh [STAGES...]   (kernels floor compiled c64 issue conv; default: all)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/lean_step/prefetch
BASE=/tmp/mtpx_195dcfd
[ -d $BASE ] || git worktree add --detach $BASE 195dcfd
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
side() { [ $1 = before ] && echo $BASE || pwd; }
# kernels: each C kernel's time within the batch-64 step (plain, and mtp8 verifying 4 drafts)
if stage kernels; then
  for s in before after before after; do
    for k in 0 4; do
      (cd $(side $s) && python experiments/lean_step/norm/kernel_times.py 64 $k) 2>&1 | grep -v Warn >> $OUT/kernels_$s.txt
    done
  done
fi
# floor: tools/bench_floor.py (each side's own copy; the tool is unchanged since 195dcfd), eager, two runs each
F="--batch-sizes 16 64 --cases plain mtp8:4 --threads 1 --pairs 10"
if stage floor; then
  for i in 1 2; do
    for s in before after; do
      (cd $(side $s) && python tools/bench_floor.py $F --out $OLDPWD/$OUT/floor_eager_${s}_$i.json) > $OUT/floor_eager_${s}_$i.txt 2>&1
    done
  done
fi
if stage compiled; then
  for s in before after; do
    (cd $(side $s) && python tools/bench_floor.py --batch-sizes 64 --cases plain mtp8:4 --threads 1 --pairs 10 --compile --out $OLDPWD/$OUT/floor_compiled_$s.json) > $OUT/floor_compiled_$s.txt 2>&1
  done
fi
# c64: the issue's end-to-end measure (GSM8K test, 128 prompts, 128 tokens, 2 chunks of 64), eager
A="--max-tokens 128 --threads 1 --num-prompts 128 --concurrency 64 --rounds 2 --contenders plain mtp4"
if stage c64; then
  for run in before:1 after:1 before:2; do
    s=${run%:*}; n=${run#*:}
    (cd $(side $s) && python tools/bench_speedup.py $A --out $OLDPWD/$OUT/c64_${s}_$n) > $OUT/c64_${s}_$n.log 2>&1
  done
fi
# pair OTHER_DIR OTHER TEMPLATE RUNS [ARGS...]: tools/bench_floor.py at plain batch 64 from OTHER_DIR
# (named OTHER) and from this tree, alternated RUNS times; logs $OUT/TEMPLATE with SIDE and RUN
# replaced by the side (OTHER or after) and the run number
pair() {
  local other=$1 name=$2 template=$3 runs=$4; shift 4
  for i in $(seq 1 $runs); do
    for s in $name after; do
      local dir=$([ $s = after ] && pwd || echo $other) log=$OUT/$(echo $template | sed "s/SIDE/$s/; s/RUN/$i/")
      (cd $dir && python tools/bench_floor.py --batch-sizes 64 --cases plain --threads 1 --pairs 10 "$@" --out $OLDPWD/$log.json) > $log.txt 2>&1
    done
  done
}
# issue: the plain batch-64 step against its floor at the issue's commit (08e9920, a worktree, with
# this tree's bench_floor.py copied in: the tool came later) and after, alternated, eager
if stage issue; then
  OLD=/tmp/mtpx_08e9920
  [ -d $OLD ] || git worktree add --detach $OLD 08e9920
  cp tools/bench_floor.py $OLD/tools/
  pair $OLD issue floor_SIDE_commit_RUN 2
fi
# conv: the Gated DeltaNet conv's constant-width sums (9024cfe) against the commit before it
# (a worktree), alternated, eager (twice) and compiled (once), plain batch 64
if stage conv; then
  PREV=/tmp/mtpx_conv_before
  [ -d $PREV ] || git worktree add --detach $PREV 9024cfe~1
  pair $PREV before floor_conv_SIDE_RUN 2
  pair $PREV before floor_conv_compiled_SIDE_RUN 1 --compile
fi
true
