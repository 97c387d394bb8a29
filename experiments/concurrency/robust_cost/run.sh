#!/bin/bash
# Issue 37's matrix with the cost corrections as running medians of their last 15 steps, faded
# toward the factor while their k is not measured (they were EMAs of weight 0.1, which a streak of
# dear steps carried: experiments/concurrency/window_layout), the same commands as after_kernels.
# Eager c1 runs twice (the cell where a correction stuck); the compiled c64 and c1 cells ran again
# after the rest (c64cb, c1cb: the first runs read 0.97x and 0.92x).
# usage: bash experiments/concurrency/robust_cost/run.sh [c1 c1b c16 c4 c64 c16c c4c c64c c1c c64cb c1cb]   (default: all)
set -x
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/robust_cost
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
A="--max-tokens 128 --threads 1 --num-prompts 128"
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
# 4 chunks of 32 prompts, but 2 of 64 at concurrency 64 (a chunk of 32 never fills a batch of 64)
run() { name=$1; shift; python tools/bench_speedup.py "$@" $A --out $OUT/$name > $OUT/$name.log 2>&1; date >> $OUT/$name.log; }
stage c1 && run eager_c1 --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c1b && run eager_c1_again --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c16 && run eager_c16 --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c4 && run eager_c4 --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c64 && run eager_c64 --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
stage c16c && run compiled_c16 --compile --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c4c && run compiled_c4 --compile --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c64c && run compiled_c64 --compile --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
stage c1c && run compiled_c1 --compile --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c64cb && run compiled_c64_again --compile --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
stage c1cb && run compiled_c1_again --compile --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
true
