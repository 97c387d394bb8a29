#!/usr/bin/env bash
# Decode tok/s before vs after the engine split, side by side in one run: the commit before the
# split (cb5c8e1) and the split with the package layering (0bc4e0a), each in a git worktree;
# demo checkpoint, plain and mtp8, eager and engine.compile, batch 1 and 16, 5 alternating rounds.
# About 12 minutes on 2 cores (four Inductor compiles of mtp8 and plain).
set -euo pipefail
cd "$(dirname "$0")/../.."
git worktree add -f /tmp/mtpx-before cb5c8e1
git worktree add -f /tmp/mtpx-after 0bc4e0a
export OMP_NUM_THREADS=2
python tools/bench_commits.py --trees /tmp/mtpx-before /tmp/mtpx-after --names before after \
  --specs none mtp8 --compile off on --batch-sizes 1 16 --repeats 5 --out experiments/engine_split
