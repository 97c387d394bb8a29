#!/usr/bin/env bash
# The stacked Gated DeltaNet commit against the per-layer one (the commit before it, in a git
# worktree): the commit alone, then decode tok/s of both trees side by side (identical tokens).
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=2
BEFORE=${BEFORE:-5d24de1}            # the last commit with one commit per layer
git worktree add -f /tmp/gdn_before "$BEFORE"
for i in 1 2; do
  python experiments/step_costs/gdn_commit/commit_alone.py /tmp/gdn_before
  python experiments/step_costs/gdn_commit/commit_alone.py
done
python tools/bench_commits.py --trees /tmp/gdn_before . --names before after --specs mtp1 mtp8 \
  --compile off --batch-sizes 1 16 --repeats 3 --out experiments/step_costs/gdn_commit
# compiled, batch 1 (each tree compiles its own graphs: about 10 minutes per spec and tree)
python tools/bench_commits.py --trees /tmp/gdn_before . --names before after --specs mtp1 \
  --compile on --batch-sizes 1 --repeats 3 --out experiments/step_costs/gdn_commit/compiled
# automatic k at depth 0 against plain decoding (after only)
python experiments/step_costs/gdn_commit/depth0_vs_plain.py 64 0.9
python experiments/step_costs/gdn_commit/depth0_vs_plain.py 64 1000
