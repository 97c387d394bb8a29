#!/usr/bin/env bash
# Issue 37, this stop's matrix, on an idle machine: concurrency 64 against the issue's code
# (08e9920), alternated, then eager and compiled at concurrency 64, 16, 4 and 1.
set -x
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
DATA=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/final
mkdir -p $OUT
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
C="plain mtp1 mtp4 mtp8 auto"
A="--rounds 2 --max-tokens 128 --threads 1"
B="python tools/bench_speedup.py"
date -u > $OUT/started.txt
if [ ! -d /tmp/mtpx_08e9920 ]; then git worktree add --detach /tmp/mtpx_08e9920 08e9920; fi
old() {  # old NAME ARGS...: tools/bench_speedup.py of the issue's commit
  local name=$1; shift
  (cd /tmp/mtpx_08e9920 && MTPX_DATA_DIR=$DATA python tools/bench_speedup.py "$@" --out $OLDPWD/$OUT/$name) > $OUT/$name.log 2>&1
}
# concurrency 64: 08e9920, this commit, 08e9920, this commit (eager_c64 has plain and mtp4)
old before_08e9920_c64_1 --concurrency 64 --num-prompts 128 $A --contenders plain mtp4
$B --concurrency 64 --num-prompts 128 $A --contenders plain mtp4 --out $OUT/after_c64_1 > $OUT/after_c64_1.log 2>&1
old before_08e9920_c64_2 --concurrency 64 --num-prompts 128 $A --contenders plain mtp4
$B --concurrency 64 --num-prompts 128 $A --contenders $C --out $OUT/eager_c64 > $OUT/eager_c64.log 2>&1
$B --concurrency 16 --num-prompts 128 $A --contenders $C --out $OUT/eager_c16 > $OUT/eager_c16.log 2>&1
$B --concurrency 4 --num-prompts 32 $A --contenders $C --out $OUT/eager_c4 > $OUT/eager_c4.log 2>&1
old before_08e9920_c1 --concurrency 1 --num-prompts 16 $A --contenders plain mtp8
$B --concurrency 1 --num-prompts 16 $A --contenders $C --out $OUT/eager_c1 > $OUT/eager_c1.log 2>&1
date -u > $OUT/finished_eager.txt
$B --compile --concurrency 64 --num-prompts 128 $A --contenders plain mtp1 mtp4 auto --out $OUT/compiled_c64 > $OUT/compiled_c64.log 2>&1
$B --compile --concurrency 1 --num-prompts 16 $A --contenders plain mtp8 auto --out $OUT/compiled_c1 > $OUT/compiled_c1.log 2>&1
$B --compile --concurrency 16 --num-prompts 128 $A --contenders plain mtp4 mtp8 auto 'auto+compile_depths=[0,4,8]' --out $OUT/compiled_c16 > $OUT/compiled_c16.log 2>&1
date -u > $OUT/finished_compiled.txt
$B --compile --concurrency 4 --num-prompts 32 $A --contenders $C --out $OUT/compiled_c4 > $OUT/compiled_c4.log 2>&1
date -u > $OUT/finished.txt
