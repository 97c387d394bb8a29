#!/bin/bash
# The paired A/B runs of experiments/lean_step/README.md: every change of the lean step off (A)
# and on (B) alternated call by call in one process, in processes with and without tune_malloc
# alternated, ROUNDS times; THREADS threads (default 1: the cores are shared).
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${THREADS:-1} PYTHONPATH=$PWD
for i in $(seq 1 "${ROUNDS:-2}"); do
  for B in 16 64; do
    for case in plain mtp8:4; do
      for tune in 0 1; do
        python experiments/lean_step/step_ab.py all $B $case 15 "${THREADS:-1}" $tune
      done
    done
  done
done
