#!/bin/bash
# tools/bench_floor.py from a checkout of the base commit (BASE, with this tool copied in) and
# from this tree, alternated RUNS times, at THREADS threads; logs under experiments/lean_step/logs.
# usage: BASE=/path/to/base/checkout THREADS=2 RUNS=2 bash experiments/lean_step/before_after.sh
set -e
cd "$(dirname "$0")/../.."
HERE=$PWD
mkdir -p experiments/lean_step/logs
for i in $(seq 1 "${RUNS:-2}"); do
  for side in before after; do
    dir=$([ $side = before ] && echo "$BASE" || echo "$HERE")
    log=$HERE/experiments/lean_step/logs/floor_${side}_t${THREADS:-2}_run$i.txt
    (cd "$dir" && uptime && OMP_NUM_THREADS=${THREADS:-2} PYTHONPATH=$dir python tools/bench_floor.py \
        --pairs 15 --threads "${THREADS:-2}") > "$log" 2>&1
    echo "== $side run $i (threads ${THREADS:-2})"; cat "$log"
  done
done
