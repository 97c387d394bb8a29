#!/usr/bin/env bash
# Issue 37: the default matrix (eager at concurrency 64, 16, 4, 1; compiled at 64 and 1), on an idle machine.
set -x
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
OUT=experiments/concurrency
C="plain mtp1 mtp4 mtp8 auto"
date -u > $OUT/started_default.txt
python tools/bench_speedup.py --concurrency 64 --num-prompts 128 --rounds 2 --max-tokens 128 --threads 1 --contenders $C --out $OUT/eager_c64 > $OUT/eager_c64.log 2>&1
python tools/bench_speedup.py --concurrency 16 --num-prompts 128 --rounds 2 --max-tokens 128 --threads 1 --contenders $C --out $OUT/eager_c16 > $OUT/eager_c16.log 2>&1
python tools/bench_speedup.py --concurrency 4 --num-prompts 64 --rounds 2 --max-tokens 128 --threads 1 --contenders $C --out $OUT/eager_c4 > $OUT/eager_c4.log 2>&1
python tools/bench_speedup.py --concurrency 1 --num-prompts 16 --rounds 2 --max-tokens 128 --threads 1 --contenders $C --out $OUT/eager_c1 > $OUT/eager_c1.log 2>&1
date -u > $OUT/finished_default.txt
python tools/bench_speedup.py --compile --concurrency 64 --num-prompts 128 --rounds 2 --max-tokens 128 --threads 1 --contenders plain mtp1 mtp4 auto --out $OUT/compiled_c64 > $OUT/compiled_c64.log 2>&1
python tools/bench_speedup.py --compile --concurrency 1 --num-prompts 16 --rounds 2 --max-tokens 128 --threads 1 --contenders plain mtp8 auto --out $OUT/compiled_c1 > $OUT/compiled_c1.log 2>&1
date -u > $OUT/finished_compiled.txt
