#!/usr/bin/env bash
# Before/after of the decode-step redesign (issue 40): the commit before it (BEFORE, a checkout)
# and this checkout, alternated process by process, twice; nothing else running.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
before=${BEFORE:?a checkout of the commit before, e.g. git worktree add /tmp/before 9069cf2}
export MTPX_CACHE_DIR=${MTPX_CACHE_DIR:-$(mktemp -d)}
for i in 1 2; do
  python "$here/before_after.py" --root "$before" --out "$here/before_$i.json"
  python "$here/before_after.py" --root "$root" --out "$here/after_$i.json"
done
python "$here/summarize.py" "$here"/before_*.json -- "$here"/after_*.json > "$here/results.md"
