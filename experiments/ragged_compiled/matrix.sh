#!/bin/bash
# The compiled cells of issue 37's matrix with ragged verification windows (afe112d), plus
# automatic k with per-request k and without ragged windows beside it at concurrency 16 and 64
# (GSM8K test, 128 prompts, 128 tokens, 1 thread; tools/bench_speedup.py, the contenders side by
# side in one process per cell). Each cell runs twice: the first builds its graphs cold.
# usage: bash experiments/ragged_compiled/matrix.sh OUT [c64 c16 c4 c1 c64b c16b c4b c1b]
set -x
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
export MTPX_DATA_DIR=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=$1; shift
mkdir -p $OUT
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
A="--max-tokens 128 --threads 1 --num-prompts 128 --compile"
stage() { [ -z "$STAGES" ] || [[ " $STAGES " == *" $1 "* ]]; }
STAGES="$*"
run() { name=$1; shift; python tools/bench_speedup.py "$@" $A --out $OUT/$name > $OUT/$name.log 2>&1; date >> $OUT/$name.log; }
C64="plain mtp1 mtp4 auto auto+per_request_k=true auto+ragged_batch=false"
C16="plain mtp4 auto auto+per_request_k=true auto+ragged_batch=false"
stage c64 && run compiled_c64 --concurrency 64 --rounds 2 --contenders $C64
stage c16 && run compiled_c16 --concurrency 16 --rounds 4 --contenders $C16
stage c4 && run compiled_c4 --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c1 && run compiled_c1 --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c64b && run compiled_c64_again --concurrency 64 --rounds 2 --contenders $C64
stage c16b && run compiled_c16_again --concurrency 16 --rounds 4 --contenders $C16
stage c4b && run compiled_c4_again --concurrency 4 --rounds 4 --contenders plain mtp4 mtp8 auto
stage c1b && run compiled_c1_again --concurrency 1 --rounds 4 --contenders plain mtp4 mtp8 auto
true
