#!/bin/bash
# The pointwise CPU kernels (mtpx/models/cpu_ops.py: RMSNorm with the residual add fused,
# silu_and_mul): (1) the eager decode step with them off (A) and on (B), alternated call by call
# in one process (experiments/lean_step/step_ab.py), batch 64 and 16, plain and mtp8 verifying 4
# drafts; (2) tools/bench_floor.py at batch 64 plain, off then on, twice (one process each).
# usage: bash experiments/lean_step/norm/run.sh
set -e
cd "$(dirname "$0")/../../.."
OUT=experiments/lean_step/norm
lscpu | grep 'Model name' > $OUT/machine.txt
grep -o 'avx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ' >> $OUT/machine.txt
(for c in "64 plain" "64 mtp8:4" "16 plain" "16 mtp8:4"; do
  OMP_NUM_THREADS=1 python experiments/lean_step/step_ab.py norm $c 15 1 2>&1 | tail -2
done) > $OUT/ab_1thread.txt
for run in 1 2; do
  for side in off on; do
    OMP_NUM_THREADS=1 python -c "
import runpy, sys
import mtpx.models.cpu_ops as c
c.use_kernel = '$side' == 'on'
sys.argv = ['bench_floor.py', '--batch-sizes', '64', '--cases', 'plain', '--pairs', '10', '--threads', '1']
runpy.run_path('tools/bench_floor.py', run_name='__main__')" > $OUT/floor_${side}_run$run.txt 2>&1
    echo "== $side run $run"; grep '^| 64' $OUT/floor_${side}_run$run.txt
  done
done
