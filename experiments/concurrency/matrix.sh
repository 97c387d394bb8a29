#!/bin/bash
# Issue 37's matrix into one experiment folder: auto against plain and the fixed k at concurrency
# 1, 4, 16 and 64, eager and compiled (GSM8K test, 128 prompts, 128 tokens, 1 thread;
# tools/bench_speedup.py, the contenders side by side in one process per cell). The compiled
# cells run twice: after a source change the first builds the fixed contenders' graphs inside its
# measured chunks ("_again": every graph loaded).
# usage: bash experiments/concurrency/matrix.sh OUT [c1c c4c c16c c64c c1 c4 c16 c64 c1cb c4cb c16cb c64cb c1c16 c1e16]   (default: all)
# (c1c16, c1e16: concurrency 1 compiled and eager in 16 chunks of 8 prompts)
set -x
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=$1; shift
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
A="--max-tokens 128 --threads 1 --num-prompts 128"
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
# 4 chunks of 32 prompts, but 2 of 64 at concurrency 64 (a chunk of 32 never fills a batch of 64)
run() { name=$1; shift; python tools/bench_speedup.py "$@" $A --out $OUT/$name > $OUT/$name.log 2>&1; date >> $OUT/$name.log; }
stage c1c && run compiled_c1 --compile --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c4c && run compiled_c4 --compile --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c16c && run compiled_c16 --compile --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c64c && run compiled_c64 --compile --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
stage c1 && run eager_c1 --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c4 && run eager_c4 --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c16 && run eager_c16 --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c64 && run eager_c64 --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
stage c1cb && run compiled_c1_again --compile --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c4cb && run compiled_c4_again --compile --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c16cb && run compiled_c16_again --compile --concurrency 16 --rounds 4 --contenders plain mtp4 auto
stage c64cb && run compiled_c64_again --compile --concurrency 64 --rounds 2 --contenders plain mtp1 mtp4 auto
stage c1c16 && run compiled_c1_16 --compile --concurrency 1 --rounds 16 --contenders plain mtp4 mtp8 auto
stage c1e16 && run eager_c1_16 --concurrency 1 --rounds 16 --contenders plain mtp4 mtp8 auto
true
