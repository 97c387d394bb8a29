#!/bin/bash
# Issue 37's matrix with settled decisions (mtpx/core/settled.py), every graph and calibration
# built by a warm-up first, then concurrency 1 again in 16 chunks of 8 prompts.
# usage: bash experiments/concurrency/settled/run.sh   (MTPX_DATA_DIR: ../shared/data by default)
cd "$(dirname "$0")/../../.."
bash experiments/concurrency/warm_matrix.sh experiments/concurrency/settled/matrix /tmp/settled_warmup
bash experiments/concurrency/matrix.sh experiments/concurrency/settled/matrix c1c16 c1e16
