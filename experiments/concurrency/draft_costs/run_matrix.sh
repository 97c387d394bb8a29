#!/bin/bash
# Issue 37's matrix on 14f3ceb (the prefill kernel, the calibrated draft rounds, the batch's
# landing): every cell of experiments/concurrency/matrix.sh, compiled concurrency 16 and 1 twice.
# usage: bash experiments/concurrency/draft_costs/run_matrix.sh
cd "$(dirname "$0")/../../.."
bash experiments/concurrency/matrix.sh experiments/concurrency/draft_costs/matrix c1c c4c c16c c64c c1 c4 c16 c64 c1cb c16cb
