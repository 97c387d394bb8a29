#!/bin/bash
# Issue 37's matrix with a fall landing on a k between only where its upper estimates beat the best
# k by the hysteresis, admissions weighing a module prefill measured at start-up and exploring's
# admissions paying theirs from the budget (docs/automatic_k.md), on top of
# experiments/concurrency/rise_margin; the commands are experiments/concurrency/matrix.sh's.
# usage: bash experiments/concurrency/landing_margin/run.sh [c1c c4c c16c c64c c1 c4 c16 c64 c1cb c4cb c16cb c64cb]   (default: all)
exec bash "$(dirname "$0")/../matrix.sh" experiments/concurrency/landing_margin "$@"
