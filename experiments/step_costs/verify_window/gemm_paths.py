"""One linear of the demo's shapes at 1, 9 and 16 rows through four fp32 paths, 2 threads: medians
of 2000 calls in µs. mm_NT: torch.mm(x, w.t()) (what a compiled graph calls); mm_NN: against a
pre-transposed weight; mkl_packed: MKL's packed GEMM (Inductor freezing's fp32 linear);
onednn: oneDNN's prepacked linear.

    python experiments/step_costs/verify_window/gemm_paths.py
"""

import torch

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
from timing import bench as _bench  # noqa: E402


def bench(f, n=2000):
    return _bench(f, n=n, warmup=100)


torch.set_num_threads(2)


def paths(K, N, M):
    w = torch.randn(N, K)
    wt = w.t().contiguous()
    x, out = torch.randn(M, K), torch.empty(M, N)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, M)
    dnn = torch.ops.mkldnn._reorder_linear_weight(w, None)
    return [bench(lambda: torch.mm(x, w.t(), out=out)), bench(lambda: torch.mm(x, wt, out=out)),
            bench(lambda: torch.ops.mkl._mkl_linear(x, packed, w, None, M)),
            bench(lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, None, "none", [], ""))]


print("| K x N | rows | mm_NT | mm_NN | mkl_packed | onednn |")
print("|---|---:|---:|---:|---:|---:|")
for K, N in [(128, 384), (384, 128), (128, 2048)]:
    for M in (1, 9, 16):
        print(f"| {K} x {N} | {M} | " + " | ".join(f"{v:.1f}" for v in paths(K, N, M)) + " |")
