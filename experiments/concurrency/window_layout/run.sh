#!/bin/bash
# The auto engine's k = 4 step against a fixed mtp4 engine's, before (bd9554b, a worktree: the
# window buffers sliced [..., :T]) and after (contiguous T-token views), alternated as processes.
# usage: bash experiments/concurrency/window_layout/run.sh
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
OUT=experiments/concurrency/window_layout
BASE=/tmp/mtpx_bd9554b
[ -d $BASE ] || git worktree add --detach $BASE bd9554b
cp $OUT/auto_step.py $BASE/$OUT/ 2>/dev/null || { mkdir -p $BASE/$OUT && cp $OUT/auto_step.py $BASE/$OUT/; }
lscpu | grep 'Model name' > $OUT/machine.txt
for B in 16 4; do
  for s in before after before after; do
    dir=$([ $s = before ] && echo $BASE || pwd)
    echo "== $s" >> $OUT/batch$B.txt
    (cd $dir && python $OUT/auto_step.py $B) 2>&1 | grep "^batch" >> $OUT/batch$B.txt
  done
done
true
