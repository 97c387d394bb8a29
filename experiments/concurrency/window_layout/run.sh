#!/bin/bash
# The auto engine's k = 4 step against a fixed mtp4 engine's, before (bd9554b, a worktree: the
# window buffers sliced [..., :T]) and after (contiguous T-token views), alternated as processes.
# usage: bash experiments/concurrency/window_layout/run.sh [step c16 rest]   (default: step; c1b: eager c1 once more)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
OUT=experiments/concurrency/window_layout
BASE=/tmp/mtpx_bd9554b
[ -d $BASE ] || git worktree add --detach $BASE bd9554b
cp $OUT/auto_step.py $BASE/$OUT/ 2>/dev/null || { mkdir -p $BASE/$OUT && cp $OUT/auto_step.py $BASE/$OUT/; }
lscpu | grep 'Model name' > $OUT/machine.txt
STAGES="${*:-step}"
stage() { [[ " $STAGES " == *" $1 "* ]]; }
stage step && for B in 16 4; do
  for s in before after before after; do
    dir=$([ $s = before ] && echo $BASE || pwd)
    echo "== $s" >> $OUT/batch$B.txt
    (cd $dir && python $OUT/auto_step.py $B) 2>&1 | grep "^batch" >> $OUT/batch$B.txt
  done
done
# c16: the issue's concurrency-16 cells again (the same commands as after_kernels), eager and compiled
A="--max-tokens 128 --threads 1 --num-prompts 128 --concurrency 16 --rounds 4 --contenders plain mtp4 auto"
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
stage c16 && python tools/bench_speedup.py $A --out $OUT/eager_c16 > $OUT/eager_c16.log 2>&1
stage c16 && python tools/bench_speedup.py $A --compile --out $OUT/compiled_c16 > $OUT/compiled_c16.log 2>&1
# rest: the other cells where automatic k runs windows narrower than its widest (c4, eager c1)
A="--max-tokens 128 --threads 1 --num-prompts 128 --rounds 4"
stage rest && python tools/bench_speedup.py $A --concurrency 4 --contenders plain mtp4 mtp8 auto --out $OUT/eager_c4 > $OUT/eager_c4.log 2>&1
stage rest && python tools/bench_speedup.py $A --concurrency 4 --contenders plain mtp4 mtp8 auto --compile --out $OUT/compiled_c4 > $OUT/compiled_c4.log 2>&1
stage rest && python tools/bench_speedup.py $A --concurrency 1 --contenders plain mtp4 mtp8 auto --out $OUT/eager_c1 > $OUT/eager_c1.log 2>&1
stage c1b && python tools/bench_speedup.py $A --concurrency 1 --contenders plain mtp4 mtp8 auto --out $OUT/eager_c1_again > $OUT/eager_c1_again.log 2>&1
true
