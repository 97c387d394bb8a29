#!/bin/bash
# The paired A/B runs of experiments/lean_step/README.md, 1 thread (the cores are shared).
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD
for change in scratch both; do
  for B in 16 64; do
    for case in plain mtp8:4; do
      python experiments/lean_step/step_ab.py $change $B $case 20 1
    done
  done
done
