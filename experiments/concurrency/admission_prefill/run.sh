#!/bin/bash
# Issue 37's matrix with admissions weighing a module prefill measured at start-up and exploring's
# admissions paying their prefill from the budget (docs/automatic_k.md, "A depth's prefill"), on
# top of experiments/concurrency/rise_margin; the commands are experiments/concurrency/matrix.sh's.
# usage: bash experiments/concurrency/admission_prefill/run.sh [c1c c4c c16c c64c c1 c4 c16 c64 c1cb c4cb c16cb c64cb]   (default: all)
exec bash "$(dirname "$0")/../matrix.sh" experiments/concurrency/admission_prefill "$@"
