"""The Gated DeltaNet depthwise causal conv (C = 256 channels, kernel 4: the demo's) in four forms,
alone, at B requests x T tokens: the unfolded sum (the only form before), K fused multiply-adds
("taps"), F.conv1d with groups = C, and einsum over the unfolded view; and the form
mtpx.models.deltanet.causal_conv picks. µs, median of 100 calls, 2 threads, under inference_mode;
the max abs error against float64 F.conv1d in brackets for bfloat16.

    OMP_NUM_THREADS=2 python experiments/step_costs/gdn_conv/forms.py
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mtpx.models.deltanet import causal_conv  # noqa: E402

torch.set_num_threads(2)
C, K = 256, 4


def forms(w):
    def unfold(ext):
        return (ext.unfold(-1, K, 1) * w[:, 0, None, :]).sum(-1)

    def taps(ext):
        T = ext.shape[-1] - K + 1
        out = ext[..., :T] * w[:, 0, :1]
        for j in range(1, K):
            out.addcmul_(ext[..., j: j + T], w[:, 0, j: j + 1])
        return out

    def conv1d(ext):
        return F.conv1d(ext, w, groups=C)

    def einsum(ext):
        return torch.einsum("bctk,ck->bct", ext.unfold(-1, K, 1), w[:, 0])

    def picked(ext):
        return causal_conv(ext, w)

    return dict(unfold=unfold, taps=taps, conv1d=conv1d, einsum=einsum, picked=picked)


with torch.inference_mode():
    for dtype, batches, lens in ((torch.float32, (1, 2, 4, 8, 16, 32, 64), (1, 2, 3, 5, 9, 16, 64)),
                                 (torch.bfloat16, (1, 16, 64), (1, 2, 9, 64))):
        w = torch.randn(C, 1, K).to(dtype)
        fns = forms(w)
        print(f"\n{dtype}\n\n| B | T | " + " | ".join(fns) + " | fastest |")
        print("|---:|---:|" + "---:|" * len(fns) + "---|")
        for B in batches:
            for T in lens:
                ext = torch.randn(B, C, K - 1 + T).to(dtype)
                ref = F.conv1d(ext.double(), w.double(), groups=C)
                cells = {}
                for name, f in fns.items():
                    ts = []
                    for _ in range(100):
                        t0 = time.perf_counter()
                        f(ext)
                        ts.append(time.perf_counter() - t0)
                    us = 1e6 * statistics.median(ts)
                    err = (f(ext).double() - ref).abs().max().item()
                    cells[name] = (us, err)
                best = min((n for n in cells if n != "picked"), key=lambda n: cells[n][0])
                fmt = ((lambda c: f"{c[0]:.1f}") if dtype == torch.float32
                       else (lambda c: f"{c[0]:.1f} ({c[1]:.3f})"))
                print(f"| {B} | {T} | " + " | ".join(fmt(c) for c in cells.values()) + f" | {best} |",
                      flush=True)
