# ruff: noqa: B023  (the lambdas are called at once, inside the loop)
"""The Gated DeltaNet conv section of a decode forward (concatenate q, k, v with the stored conv
window, the depthwise causal conv, SiLU, split, and a first use of q, k, v), channels-first as
mtpx computes it ([B, C, K-1+T], then transposed back) against time-major ([B, K-1+T, C], the
taps vectorized over the 256 channels), per layer, µs (median of 100 calls, two runs each),
outputs checked equal. Not adopted: experiments/step_costs/batch64_window/README.md.

    OMP_NUM_THREADS=2 python experiments/step_costs/batch64_window/conv_layout.py
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mtpx.models.deltanet import causal_conv  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
from timing import bench  # noqa: E402  (tools/timing.py)

torch.set_num_threads(2)
C, K = 256, 4
w = torch.randn(C, 1, K)
state = torch.randn(65, C, K - 1)



def channels_first(q, k, v, rows):
    mixed = torch.cat([q, k, v], dim=-1).transpose(1, 2)
    ext = torch.cat([state.index_select(0, rows), mixed], dim=-1)
    conv = F.silu(causal_conv(ext, w)).transpose(1, 2)
    q, k, v = conv.split([64, 64, 128], dim=-1)
    return (q * q).sum(-1), k * 2, v * 2, ext


def time_major(q, k, v, rows):
    mixed = torch.cat([q, k, v], dim=-1)
    ext = torch.cat([state.index_select(0, rows).transpose(1, 2), mixed], dim=1)
    T = ext.shape[1] - K + 1
    wt = w[:, 0].t()
    out = ext[:, :T] * wt[0]
    for j in range(1, K):
        out.addcmul_(ext[:, j: j + T], wt[j])
    q, k, v = F.silu(out).split([64, 64, 128], dim=-1)
    return (q * q).sum(-1), k * 2, v * 2, ext.transpose(1, 2)


with torch.inference_mode():
    for B in (64, 16, 1):
        rows = torch.arange(B)
        for T in (1, 2, 5, 9):
            q, k, v = torch.randn(B, T, 64), torch.randn(B, T, 64), torch.randn(B, T, 128)
            for x, y in zip(channels_first(q, k, v, rows), time_major(q, k, v, rows)):
                torch.testing.assert_close(x, y)
            r = [(bench(lambda: channels_first(q, k, v, rows)), bench(lambda: time_major(q, k, v, rows)))
                 for _ in range(2)]
            print(f"B {B} T {T}: channels-first {r[0][0]} {r[1][0]}, time-major {r[0][1]} {r[1][1]}")
