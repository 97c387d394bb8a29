#!/bin/bash
# Issue 37's matrix with automatic k's admissions paying their depth's module prefill
# (docs/automatic_k.md, "A depth's prefill is a cost of its admission"); the commands are
# experiments/concurrency/matrix.sh's.
# usage: bash experiments/concurrency/prefill_cost/run.sh [c1c c4c c16c c64c c1 c4 c16 c64 c1cb c4cb c16cb c64cb]   (default: all)
exec bash "$(dirname "$0")/../matrix.sh" experiments/concurrency/prefill_cost "$@"
