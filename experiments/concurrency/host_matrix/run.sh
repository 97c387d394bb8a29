#!/bin/bash
# Issue 37's matrix after the policy's host work was cut and a step drafting one more than the one
# before needs no catch-up round (experiments/concurrency/host_work), every graph and calibration
# built by a warm-up first.
# usage: bash experiments/concurrency/host_matrix/run.sh   (MTPX_DATA_DIR: ../shared/data by default)
cd "$(dirname "$0")/../../.."
bash experiments/concurrency/warm_matrix.sh experiments/concurrency/host_matrix /tmp/host_matrix_warmup
