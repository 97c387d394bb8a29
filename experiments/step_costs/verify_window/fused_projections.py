"""The linears of one Gated DeltaNet layer of the demo (hidden 128) as they are (qkvz, ba, out,
gate, up, down: 6 mm) and fused as vLLM fuses them (qkvz+ba, gate+up: 4 mm), at 1 and 9 rows,
fp32 and bf16, 2 threads: medians of 1000 calls of the whole set, µs; two repeats.

    python experiments/step_costs/verify_window/fused_projections.py
"""

import torch

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
from timing import bench as _bench  # noqa: E402


def bench(f, n=1000):
    return _bench(f, n=n, warmup=100)


torch.set_num_threads(2)


def layer(shapes, M, dtype):
    ws = [torch.randn(N, K, dtype=dtype) for K, N in shapes]
    xs = [torch.randn(M, K, dtype=dtype) for K, N in shapes]
    outs = [torch.empty(M, N, dtype=dtype) for K, N in shapes]

    def f():
        for x, w, o in zip(xs, ws, outs):
            torch.mm(x, w.t(), out=o)
    return bench(f)


separate = [(128, 384), (128, 8), (128, 128), (128, 384), (128, 384), (384, 128)]
fused = [(128, 392), (128, 128), (128, 768), (384, 128)]
print("| repeat | dtype | separate, 1 row | separate, 9 rows | fused, 1 row | fused, 9 rows | 9 / 1 separate "
      "| 9 / 1 fused |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
for rep in range(2):
    for dtype in (torch.float32, torch.bfloat16):
        r = {(name, M): layer(shapes, M, dtype) for name, shapes in (("s", separate), ("f", fused))
             for M in (1, 9)}
        print(f"| {rep} | {str(dtype)[6:]} | {r['s', 1]:.1f} | {r['s', 9]:.1f} | {r['f', 1]:.1f} | "
              f"{r['f', 9]:.1f} | {r['s', 9] / r['s', 1]:.2f} | {r['f', 9] / r['f', 1]:.2f} |")
