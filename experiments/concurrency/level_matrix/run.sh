#!/bin/bash
# Issue 37's matrix after the calibration keeps the least of three passes (36f46d3) and the cost
# corrections became level x shape (5111d45), every graph and calibration built by a warm-up first.
# usage: bash experiments/concurrency/level_matrix/run.sh   (MTPX_DATA_DIR: ../shared/data by default)
cd "$(dirname "$0")/../../.."
bash experiments/concurrency/warm_matrix.sh experiments/concurrency/level_matrix /tmp/level_matrix_warmup
