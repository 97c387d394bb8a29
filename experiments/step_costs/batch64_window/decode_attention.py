# ruff: noqa: B023  (the lambdas are called at once, inside the loop)
"""Decode-time attention at batch B over the demo's shapes (4 query heads, 2 KV heads, head dim
32, keys gathered from the paged cache: 208 positions, T queries per request at the end of each
request's 192 known tokens): F.scaled_dot_product_attention with the boolean mask the torch
backend builds (the flash CPU kernel) against the same attention written out (grouped-query
scores by `matmul`, masked softmax, `matmul`), µs per call (median of 100, two runs each),
outputs checked equal.

    OMP_NUM_THREADS=2 python experiments/step_costs/batch64_window/decode_attention.py
"""

import torch
import torch.nn.functional as F

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
from timing import bench  # noqa: E402  (tools/timing.py)

torch.set_num_threads(2)
H, Hkv, D, S = 4, 2, 32, 208



def sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def written_out(q, k, v, mask):
    B, _, T, _ = q.shape
    g = q.view(B, Hkv, H // Hkv * T, D)                          # query heads sharing a KV head
    scores = (g @ k.transpose(-1, -2)) * D ** -0.5               # [B, Hkv, H/Hkv T, S]
    scores = scores.view(B, H, T, -1).masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1).view(B, Hkv, -1, scores.shape[-1]) @ v).view(B, H, T, D)


with torch.inference_mode():
    for B in (64, 16, 1):
        for T in (1, 2, 5, 9):
            q = torch.randn(B, H, T, D)
            k, v = torch.randn(B, S, Hkv, D).transpose(1, 2), torch.randn(B, S, Hkv, D).transpose(1, 2)
            pos = 192 + torch.arange(T)
            mask = (torch.arange(S)[None, None, None, :] <= pos[None, None, :, None]).expand(B, 1, T, S)
            torch.testing.assert_close(written_out(q, k, v, mask), sdpa(q, k, v, mask), atol=1e-5, rtol=1e-5)
            r = [(bench(lambda: sdpa(q, k, v, mask)),
                  bench(lambda: written_out(q, k, v, mask))) for _ in range(2)]
            print(f"B {B} T {T}: sdpa {r[0][0]} {r[1][0]}, written out {r[0][1]} {r[1][1]}")
