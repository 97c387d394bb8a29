#!/bin/bash
# Issue 37's matrix on the final code (2026-12-06): every cell of ../matrix.sh once, after a
# warm-up pass of the compiled cells (into /tmp, not kept) built and saved every graph, so no
# measured chunk builds one; then compiled concurrency 16, the cell nearest the bar, twice more.
# usage: bash experiments/concurrency/closing/run.sh   (MTPX_DATA_DIR: ../shared/data by default)
cd "$(dirname "$0")/../../.."
OUT=experiments/concurrency/closing
bash experiments/concurrency/matrix.sh $OUT c1c c4c c16c c64c c1 c4 c16 c64 c16cb
mkdir -p $OUT/third && bash experiments/concurrency/matrix.sh $OUT/third c16c
# the cells below 0.97x paired in the run above, once more (eager c1, eager c16, compiled c64)
mkdir -p $OUT/again && bash experiments/concurrency/matrix.sh $OUT/again c64c c1 c16
