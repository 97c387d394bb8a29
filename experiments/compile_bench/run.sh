#!/usr/bin/env bash
# eager, one graph and layer regions side by side (experiments/compile_bench/README.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
for spec in none mtp8; do
  python tools/bench_compile.py --spec "$spec" --batch-sizes 1 64 --output-len 64 --repeats 3 \
      --out "experiments/compile_bench/$spec"
done
