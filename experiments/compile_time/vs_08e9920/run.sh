#!/usr/bin/env bash
# Compiled plain and mtp8 of the previous commit (08e9920, a checkout in BEFORE) against this
# checkout, alternated process by process, twice; nothing else running (decode_step/before_after.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../../.." && pwd)
before=${BEFORE:?a checkout of 08e9920, e.g. git worktree add /tmp/before 08e9920}
export MTPX_CACHE_DIR=${MTPX_CACHE_DIR:-$(mktemp -d)}
for i in ${ROUNDS:-1 2}; do
  python "$root/experiments/decode_step/before_after.py" --root "$before" --modes compiled --c1-prompts 16 --out "$here/before_$i.json"
  python "$root/experiments/decode_step/before_after.py" --root "$root" --modes compiled --c1-prompts 16 --out "$here/after_$i.json"
done
python "$root/experiments/decode_step/summarize.py" "$here"/before_*.json -- "$here"/after_*.json > "$here/results.md"
