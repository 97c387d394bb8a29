#!/bin/bash
# Issue 37's matrix again on the faster kernels of experiments/lean_step/floor_2x (the few-row
# linear kernel made batch 1-16 steps 0.79x-0.87x, which changes where each k pays): auto against
# plain and the fixed k, the same commands as experiments/concurrency/robust_cost.
# usage: bash experiments/concurrency/after_floor_2x/run.sh [c1 c4 c16 c64 c1c c4c c16c c64c c16b c1cb c16cb c64cb]   (default: all)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/after_floor_2x
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
A="--max-tokens 128 --threads 1 --num-prompts 128"
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
# 4 chunks of 32 prompts, but 2 of 64 at concurrency 64 (a chunk of 32 never fills a batch of 64)
run() { name=$1; shift; python tools/bench_speedup.py "$@" $A --out $OUT/$name > $OUT/$name.log 2>&1; date >> $OUT/$name.log; }
stage c1 && run eager_c1 --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c4 && run eager_c4 --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c16 && run eager_c16 --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c64 && run eager_c64 --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
stage c1c && run compiled_c1 --compile --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c4c && run compiled_c4 --compile --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c16c && run compiled_c16 --compile --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c64c && run compiled_c64 --compile --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
# again, once the compiled graphs of this source are in the cache (the first compiled runs built
# the fixed contenders' graphs for new batch sizes inside their measured chunks), and eager c16
stage c16b && run eager_c16_again --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c1cb && run compiled_c1_again --compile --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c16cb && run compiled_c16_again --compile --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c64cb && run compiled_c64_again --compile --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
true
