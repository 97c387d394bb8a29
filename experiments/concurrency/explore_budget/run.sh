#!/usr/bin/env bash
# Issue 37, automatic k: exploring pauses once it has spent explore_budget (1%) of the steps'
# predicted cost (mtpx/core/draft_length.py, `explore_spent`). GSM8K test, greedy, 128 tokens,
# 1 thread, the contenders side by side in one process per (concurrency, mode), 2 chunks
# alternated.
# From commit d24f27b auto's default compiled buckets are [0, 4, 8]: c16c and c16c2 ran before it
# (their auto is [0, 8]); c4c compares the new default with [0, 8].
# usage: bash experiments/concurrency/explore_budget/run.sh [STAGES...]   (c16c c16c2 c16 c4c c4 c64; default: all)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/explore_budget
mkdir -p $OUT
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
A="--rounds 2 --max-tokens 128 --threads 1"
B="python tools/bench_speedup.py"
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
if stage c16c; then
  $B --compile --concurrency 16 --num-prompts 128 $A --contenders plain mtp4 auto --out $OUT/compiled_c16 > $OUT/compiled_c16.log 2>&1
fi
if stage c16c2; then
  $B --compile --concurrency 16 --num-prompts 128 $A --contenders plain mtp4 auto "auto+compile_depths=[0,4,8]" --out $OUT/compiled_c16_buckets > $OUT/compiled_c16_buckets.log 2>&1
fi
if stage c16; then
  $B --concurrency 16 --num-prompts 128 $A --contenders plain mtp4 auto --out $OUT/eager_c16 > $OUT/eager_c16.log 2>&1
fi
if stage c4c; then
  $B --compile --concurrency 4 --num-prompts 32 $A --contenders plain mtp4 mtp8 auto "auto+compile_depths=[0,8]" --out $OUT/compiled_c4 > $OUT/compiled_c4.log 2>&1
fi
if stage c4; then
  $B --concurrency 4 --num-prompts 32 $A --contenders plain mtp4 mtp8 auto --out $OUT/eager_c4 > $OUT/eager_c4.log 2>&1
fi
if stage c64; then
  $B --concurrency 64 --num-prompts 128 $A --contenders plain mtp4 auto --out $OUT/eager_c64 > $OUT/eager_c64.log 2>&1
fi
