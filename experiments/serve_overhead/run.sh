#!/usr/bin/env bash
# Throughput over HTTP (mode=serve + mode=bench bench.base_url) vs in process (mode=bench), the
# same workload: the demo checkpoint, mtp8, 32 built-in prompts, 64 output tokens, concurrency 16,
# 1 torch thread everywhere. The two are alternated, 3 rounds; each run's metrics.json is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=experiments/serve_overhead
export OMP_NUM_THREADS=1
PORT=8123
COMMON="mode=bench logger=none bench.num_prompts=32 bench.max_tokens=64 bench.concurrency=16 bench.threads=1"
python train_or_eval.py mode=serve +spec=mtp8 serve.port=$PORT serve.threads=1 logger=none \
  hydra.run.dir=/tmp/mtpx_serve_overhead/server > /tmp/mtpx_serve_overhead_server.log 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null || true' EXIT
for i in $(seq 1 120); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
for round in 1 2 3; do
  python train_or_eval.py $COMMON +spec=mtp8 hydra.run.dir=$OUT/runs/inprocess_$round > /dev/null
  python train_or_eval.py $COMMON bench.base_url=http://127.0.0.1:$PORT/v1 hydra.run.dir=$OUT/runs/http_$round > /dev/null
done
python - <<'PY'
import json, statistics
from pathlib import Path
out = Path("experiments/serve_overhead")
rows = []
for r in (1, 2, 3):
    a = json.loads((out / f"runs/inprocess_{r}/metrics.json").read_text())
    b = json.loads((out / f"runs/http_{r}/metrics.json").read_text())
    rows.append((r, a["output_throughput"], b["output_throughput"], b["output_throughput"] / a["output_throughput"],
                 a["acceptance_length"], b["acceptance_length"], a["median_ttft_ms"], b["median_ttft_ms"]))
lines = ["| round | in-process tok/s | HTTP tok/s | HTTP / in-process | acceptance length (in-process, HTTP) | median TTFT ms (in-process, HTTP) |",
         "|---:|---:|---:|---:|---|---|"]
lines += [f"| {r} | {a:.1f} | {b:.1f} | {x:.3f} | {la:.2f}, {lb:.2f} | {ta:.0f}, {tb:.0f} |" for r, a, b, x, la, lb, ta, tb in rows]
ratios = [x[3] for x in rows]
lines.append(f"\nmedian HTTP / in-process {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
