"""One linear of the demo's shapes at 1 and 9 rows, as torch.mm (what a compiled graph calls), with
1 and 2 threads: medians of 2000 calls in µs.

    python experiments/step_costs/verify_window/linear_shapes.py
"""

import torch

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
from timing import bench as _bench  # noqa: E402


def bench(f, n=2000):
    return _bench(f, n=n, warmup=100)



print("| threads | K x N | 1 row µs | 9 rows µs |")
print("|---:|---|---:|---:|")
for threads in (1, 2):
    torch.set_num_threads(threads)
    for K, N in [(128, 384), (384, 128), (128, 128), (128, 2048)]:
        w = torch.randn(N, K)
        r = {}
        for M in (1, 9):
            x, out = torch.randn(M, K), torch.empty(M, N)
            r[M] = bench(lambda x=x, w=w, out=out: torch.mm(x, w.t(), out=out))
        print(f"| {threads} | {K} x {N} | {r[1]:.1f} | {r[9]:.1f} |")
