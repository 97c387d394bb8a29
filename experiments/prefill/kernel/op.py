"""The prefill recurrence per layer call: the C window kernel with the final state rebuilt
(`gdn_kernel.window` + `WindowStates.state_after`) against the chunked torch form, demo head
shapes (4 value heads of 32 x 32), float32, 1 thread, median of 30 calls; max abs difference.
usage: OMP_NUM_THREADS=1 python experiments/prefill/kernel/op.py"""
import time

import torch
import torch.nn.functional as F

from mtpx.models import gdn_kernel
from mtpx.models.gated_delta_rule import gated_delta_rule_chunked

torch.set_num_threads(1)
H, DK, DV = 4, 32, 32


def bench(fn, x, n=30):
    fn(x)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
    return 1e3 * sorted(ts)[n // 2]


def chunked(x):
    return gated_delta_rule_chunked(*x)[:2]


def kernel(x):
    o, w = gdn_kernel.window(*x)
    B, T = x[0].shape[:2]
    return o, w.state_after(x[-1], torch.full((B,), T - 1))


for B, T in ((1, 8), (1, 24), (1, 64), (1, 128), (1, 300), (4, 100), (16, 100)):
    x = (F.normalize(torch.randn(B, T, H, DK), dim=-1), F.normalize(torch.randn(B, T, H, DK), dim=-1),
         torch.randn(B, T, H, DV), -torch.rand(B, T, H) * 0.1, torch.rand(B, T, H),
         0.1 * torch.randn(B, H, DK, DV))
    (oc, fc), (ow, fw) = chunked(x), kernel(x)
    print(f"B={B} T={T}: chunked {bench(chunked, x):.3f} ms, kernel {bench(kernel, x):.3f} ms; "
          f"max |diff| o {(oc - ow).abs().max():.1e}, final state {(fc - fw).abs().max():.1e}", flush=True)
