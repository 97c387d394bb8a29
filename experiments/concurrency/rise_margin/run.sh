#!/bin/bash
# Issue 37's matrix with the k in use rising by a 2% margin and falling by 5%, a held depth
# waiting for the rise (docs/automatic_k.md, "Hysteresis and patience"), on top of
# experiments/concurrency/prefill_cost; the commands are experiments/concurrency/matrix.sh's.
# usage: bash experiments/concurrency/rise_margin/run.sh [c1c c4c c16c c64c c1 c4 c16 c64 c1cb c4cb c16cb c64cb]   (default: all)
exec bash "$(dirname "$0")/../matrix.sh" experiments/concurrency/rise_margin "$@"
