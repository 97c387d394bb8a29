# ruff: noqa: B023  (the lambdas are called at once, inside the loop)
"""The window form's small batched products at N = rows x heads matrices, µs (median of 200
calls): [T, T] @ [T, 32] as `bmm`, as a broadcast multiply-and-sum and as einsum; [T, 32] @
[32, T] as `bmm` and broadcast; [T, 32] @ [32, 32] as `bmm`. Not adopted:
experiments/step_costs/batch64_window/README.md.

    OMP_NUM_THREADS=2 python experiments/step_costs/batch64_window/window_products.py
"""

import torch

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
from timing import bench as timed  # noqa: E402  (tools/timing.py)


def bench(f):
    return timed(f, n=200, warmup=10)

torch.set_num_threads(2)



for N in (256, 64, 4):
    for T in (2, 3, 5, 9):
        W, X = torch.randn(N, T, T), torch.randn(N, T, 32)
        K, S, Q = torch.randn(N, 32, T), torch.randn(N, 32, 32), torch.randn(N, T, 32)
        r = [bench(lambda: W @ X), bench(lambda: (W[..., None] * X[:, None]).sum(-2)),
             bench(lambda: torch.einsum("nij,njd->nid", W, X)),
             bench(lambda: Q @ K), bench(lambda: (Q[:, :, None, :] * K.transpose(1, 2)[:, None]).sum(-1)),
             bench(lambda: Q @ S)]
        print(f"N {N} T {T}: TxT@Tx32 bmm {r[0]} broadcast {r[1]} einsum {r[2]} | "
              f"Tx32@32xT bmm {r[3]} broadcast {r[4]} | Tx32@32x32 bmm {r[5]}")
