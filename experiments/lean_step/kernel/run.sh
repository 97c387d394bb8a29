#!/bin/bash
# The CPU kernels (paged attention; one Gated DeltaNet decode token), before (BASE: 0dfa6a3, with
# this tools/bench_floor.py copied in) and after (this tree), alternated: tools/bench_floor.py at
# batch 64, plain and mtp8 verifying 4 drafts, 1 thread, eager (two runs each side) and compiled
# (one run each side). TAG names the output files (default: after).
# usage: BASE=/tmp/mtpx_base TAG=gdn bash experiments/lean_step/kernel/run.sh
set -e
cd "$(dirname "$0")/../../.."
HERE=$PWD
OUT=$HERE/experiments/lean_step/kernel
TAG=${TAG:-after}
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
A="--batch-sizes 64 --cases plain mtp8:4 --pairs 10 --threads 1"
for mode in eager compiled; do
  runs=$([ $mode = eager ] && echo "1 2" || echo "1")
  flag=$([ $mode = compiled ] && echo "--compile" || echo "")
  for i in $runs; do
    for side in before $TAG; do
      dir=$([ $side = before ] && echo "$BASE" || echo "$HERE")
      name=${mode}_${side}_run$i
      [ $side = before ] && [ -n "$SKIP_BEFORE" ] && continue
      (cd "$dir" && OMP_NUM_THREADS=1 PYTHONPATH=$dir python tools/bench_floor.py $A $flag \
        --out $OUT/$name.json) > $OUT/$name.txt 2>&1
      echo "== $mode $side run $i"; grep '^| 64' $OUT/$name.txt
    done
  done
done
