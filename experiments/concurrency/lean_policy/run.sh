#!/bin/bash
# Issue 37's matrix on automatic k with half its host work per step (c62ae20), on top of
# experiments/concurrency/landing_margin; the commands are experiments/concurrency/matrix.sh's.
# usage: bash experiments/concurrency/lean_policy/run.sh [c1c c4c c16c c64c c1 c4 c16 c64 c1cb c4cb c16cb c64cb]   (default: all)
exec bash "$(dirname "$0")/../matrix.sh" experiments/concurrency/lean_policy "$@"
