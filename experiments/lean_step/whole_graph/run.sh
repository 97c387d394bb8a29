#!/bin/bash
# The compiled plain step as one graph (engine.compile_regions=false: Inductor's C++ wrapper, the
# Gated DeltaNet decode op in place) against layer regions (the default), 1 thread; logs beside
# this script. ops: the C kernels' torch operators, custom_op's wrapper against Library's.
# usage: bash experiments/lean_step/whole_graph/run.sh [ops floor c64 spec]   (default: all but spec)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/lean_step/whole_graph
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
stage() { [ -z "$STAGES" ] && [ $1 != spec ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
stage ops && python $OUT/ops_bench.py > $OUT/ops.txt 2>&1
# floor: tools/bench_floor.py, the two builds alternated as processes, twice
if stage floor; then
  for i in 1 2; do
    for m in regions whole; do
      flag=$([ $m = whole ] && echo false || echo true)
      python tools/bench_floor.py --batch-sizes 16 64 --cases plain --threads 1 --pairs 10 --compile \
        --engine compile_regions=$flag --out $OUT/floor_${m}_$i.json > $OUT/floor_${m}_$i.txt 2>&1
    done
  done
fi
# c64: the issue's end-to-end measure, the two side by side in one process
stage c64 && python tools/bench_speedup.py --compile --concurrency 64 --num-prompts 128 --rounds 2 --max-tokens 128 \
  --threads 1 --contenders plain plain+compile_regions=false --out $OUT/compiled_c64 > $OUT/compiled_c64.log 2>&1
# spec: mtp8 verifying and proposing 4 drafts at batch 64, one graph then regions (one graph: 3
# graphs to build, about 3.5 minutes); floor_spec_whole_before.txt is the same one-graph command
# on b35a86e, before mtpx::write_window_
if stage spec; then
  for m in whole regions; do
    flag=$([ $m = whole ] && echo false || echo true)
    python tools/bench_floor.py --batch-sizes 64 --cases mtp8:4 --threads 1 --pairs 5 --compile \
      --engine compile_regions=$flag --out $OUT/floor_spec_$m.json > $OUT/floor_spec_$m.txt 2>&1
  done
fi
true
