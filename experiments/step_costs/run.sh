#!/usr/bin/env bash
# The engine's decode step beside its forwards timed alone (tools/bench_step.py): the demo
# checkpoint, plain / mtp1 (k=1) / mtp8 (k=8), batch 1, 4, 16, 64, eager and engine.compile.
# About 8 minutes on 2 cores (three Inductor compiles).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=2
python tools/bench_step.py --specs none mtp1 mtp8 --batch-sizes 1 4 16 64 --modes eager compiled \
  --repeats 10 --out experiments/step_costs
