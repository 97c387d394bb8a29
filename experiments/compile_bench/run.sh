#!/usr/bin/env bash
# engine.compile on vs off on the demo checkpoint, side by side in one run per speculator
# (2 CPU threads; about 5 minutes each including the one-time compile).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=2
python tools/bench_compile.py --spec mtp8 --batch-sizes 1 16 --out experiments/compile_bench
python tools/bench_compile.py --spec mtp1 --batch-sizes 1 16 --out experiments/compile_bench/mtp1
python tools/bench_compile.py --spec none --batch-sizes 1 16 --out experiments/compile_bench/plain
