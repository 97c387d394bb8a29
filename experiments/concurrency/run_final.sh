#!/usr/bin/env bash
# Issue 37, this stop's matrix, on an idle machine: concurrency 64 against the issue's code
# (08e9920) back to back, then eager and compiled at concurrency 64, 16, 4 and 1.
set -x
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
DATA=${MTPX_DATA_DIR:-$(cd .. && pwd)/shared/data}
OUT=experiments/concurrency/final
mkdir -p $OUT
lscpu | grep 'Model name' > $OUT/machine.txt
C="plain mtp1 mtp4 mtp8 auto"
A="--num-prompts 128 --rounds 2 --max-tokens 128 --threads 1"
date -u > $OUT/started.txt
if [ ! -d /tmp/mtpx_08e9920 ]; then git worktree add --detach /tmp/mtpx_08e9920 08e9920; fi
# the two commits alternate twice, so the change is read against the run-to-run spread
for i in 1 2; do
  (cd /tmp/mtpx_08e9920 && MTPX_DATA_DIR=$DATA python tools/bench_speedup.py --concurrency 64 $A --contenders plain mtp4 --out $OLDPWD/$OUT/before_08e9920_c64_$i) > $OUT/before_08e9920_c64_$i.log 2>&1
  python tools/bench_speedup.py --concurrency 64 $A --contenders plain mtp4 --out $OUT/after_c64_$i > $OUT/after_c64_$i.log 2>&1
done
for c in 64 16; do
  python tools/bench_speedup.py --concurrency $c $A --contenders $C --out $OUT/eager_c$c > $OUT/eager_c$c.log 2>&1
done
python tools/bench_speedup.py --concurrency 4 --num-prompts 64 --rounds 2 --max-tokens 128 --threads 1 --contenders $C --out $OUT/eager_c4 > $OUT/eager_c4.log 2>&1
# concurrency 1 against the issue's code, eager (its compiled engines took 8-21 minutes to build)
(cd /tmp/mtpx_08e9920 && MTPX_DATA_DIR=$DATA python tools/bench_speedup.py --concurrency 1 --num-prompts 16 --rounds 2 --max-tokens 128 --threads 1 --contenders plain mtp8 --out $OLDPWD/$OUT/before_08e9920_c1) > $OUT/before_08e9920_c1.log 2>&1
python tools/bench_speedup.py --concurrency 1 --num-prompts 16 --rounds 2 --max-tokens 128 --threads 1 --contenders $C --out $OUT/eager_c1 > $OUT/eager_c1.log 2>&1
date -u > $OUT/finished_eager.txt
python tools/bench_speedup.py --compile --concurrency 64 $A --contenders $C --out $OUT/compiled_c64 > $OUT/compiled_c64.log 2>&1
python tools/bench_speedup.py --compile --concurrency 16 $A --contenders $C 'auto+compile_depths=[0,4,8]' --out $OUT/compiled_c16 > $OUT/compiled_c16.log 2>&1
python tools/bench_speedup.py --compile --concurrency 4 --num-prompts 64 --rounds 2 --max-tokens 128 --threads 1 --contenders $C --out $OUT/compiled_c4 > $OUT/compiled_c4.log 2>&1
python tools/bench_speedup.py --compile --concurrency 1 --num-prompts 16 --rounds 2 --max-tokens 128 --threads 1 --contenders $C --out $OUT/compiled_c1 > $OUT/compiled_c1.log 2>&1
date -u > $OUT/finished.txt
