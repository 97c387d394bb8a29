#!/bin/bash
# Automatic k against fixed k (experiments/auto_k_never_loses): 8 cells (concurrency 1, 4, 16, 64 x eager,
# compiled) x 3 runs of tools/bench_speedup.py --interleave 4, contenders plain mtp1 mtp4 mtp8 auto, each
# run one tools/bench_core.sh call; the first runs of every cell, then the second (built in reverse:
# --build-reversed), then the third. Resumable: a run whose speedup.json exists is skipped. ISOLATE=1 adds
# --isolate (every contender's engine in a process of its own).
#   OUT=/tmp/matrix MTPX_DATA_DIR=/path/to/data bash tools/auto_k_matrix.sh
#   python tools/matrix_table.py /tmp/matrix
# Run it from a checkout nobody edits while it runs (compile caches are keyed by mtpx's source), with
# MTPX_CACHE_DIR of its own; warm compile caches may be built first off the benchmark core, but delete
# the step_costs that warm-up measured (automatic k must calibrate on the benchmark core).
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/auto_k_matrix}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
cell_args() {   # concurrency -> prompts and tokens: every one of 4 chunks holds >= concurrency prompts
  case $1 in 1) echo "--num-prompts 16 --max-tokens 256";; 4) echo "--num-prompts 32 --max-tokens 128";;
             16) echo "--num-prompts 64 --max-tokens 128";; 64) echo "--num-prompts 256 --max-tokens 128";; esac
}
for r in ${RUNS:-1 2 3}; do
  rev=""; [ "$r" = 2 ] && rev="--build-reversed"
  for cell in ${CELLS:-compiled_16 compiled_64 eager_1 eager_4 eager_16 eager_64 compiled_4 compiled_1}; do
    mode=${cell%_*} c=${cell#*_} name=${cell%_*}_c${cell#*_}_r$r
    [ -f "$OUT/$name/speedup.json" ] && { echo "$name: done, skipped"; continue; }
    flag=""; [ "$mode" = compiled ] && flag="--compile"
    t0=$(date +%s)
    tools/bench_core.sh timeout 590 python tools/bench_speedup.py $flag --concurrency "$c" $(cell_args "$c") \
      --rounds 4 --threads 1 --interleave 4 $rev ${ISOLATE:+--isolate} --contenders plain mtp1 mtp4 mtp8 auto \
      --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - t0 )) s, ended $(date +%T)"
  done
done
