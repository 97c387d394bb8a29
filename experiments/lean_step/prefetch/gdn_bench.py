"""The Gated DeltaNet decode kernel alone: 64 requests, L layers of the demo's shapes (nk 2, nv 4,
dk = dv = 32, conv 4), in place, a 64 MB buffer written between timed calls (EVICT=0: not), 30
timed calls after 3.

    OMP_NUM_THREADS=1 [L=24] [EVICT=1] python experiments/lean_step/prefetch/gdn_bench.py
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
import torch  # noqa: E402
from timing import quartiles  # noqa: E402

from mtpx.models import gdn_kernel  # noqa: E402

torch.set_num_threads(1)
B, L, nk, nv, dk, dv, K = 64, int(os.environ.get("L", 24)), 2, 4, 32, 32, 4
C, F = 2 * nk * dk + nv * dv, 2 * nk * dk + 2 * nv * dv
torch.manual_seed(0)
layers = [dict(conv=torch.randn(B + 2, C, K - 1), ssm=torch.randn(B + 2, nv, dk, dv) * 0.1,
               w=torch.randn(C, K) * 0.3, A=torch.randn(nv) * 0.1, dt=torch.randn(nv) * 0.1,
               nw=torch.ones(dv))
          for _ in range(L)]
x, gates = torch.randn(B, F), torch.randn(B, 2 * nv)
rows, valid = torch.arange(B) + 1, torch.ones(B, dtype=torch.bool)
assert gdn_kernel.available()
evict = os.environ.get("EVICT", "1") == "1"
big = torch.empty(64 << 20, dtype=torch.uint8)


def once():
    for d in layers:
        gdn_kernel._gdn_decode(x, gates, d["w"], d["conv"], d["ssm"], rows, valid, d["A"], d["dt"], d["nw"],
                               1e-6, nk, nv, True)


def before():
    for d in layers:
        d["ssm"].mul_(0.5)                     # keep the states bounded
    if evict:
        big.add_(1)


q1, med, q3 = quartiles(once, before=before)
print(f"{L} layers: median {med:.2f} ms (q1 {q1:.2f}, q3 {q3:.2f})")
