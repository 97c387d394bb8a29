"""The paged-attention kernel alone: B requests at context 200 over 8 layers' paged caches (blocks
of 16, Hkv 2, D 32, H 4), one call per layer, a 64 MB buffer written between timed calls so that the
keys and values come from memory (EVICT=0: not), 30 timed calls after 3 (experiments/timing.py `quartiles`).

    OMP_NUM_THREADS=1 [B=64] [T=1] [L=8] [EVICT=1] python experiments/lean_step/prefetch/attn_bench.py
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
import torch  # noqa: E402
from timing import quartiles  # noqa: E402

from mtpx.attention import cpu_kernel  # noqa: E402

torch.set_num_threads(1)
B, T, L = int(os.environ.get("B", 64)), int(os.environ.get("T", 1)), int(os.environ.get("L", 8))
H, Hkv, D, S, ctx = 4, 2, 32, 16, 200
per_request = (ctx + S) // S + 1
torch.manual_seed(0)
layers = [(torch.randn(B * per_request + 8, S, Hkv, D),
           torch.randn(B * per_request + 8, S, Hkv, D)) for _ in range(L)]
table = torch.arange(B * per_request).view(B, per_request) + 1
positions = torch.full((B, T), ctx, dtype=torch.int64) + torch.arange(T)
valid = torch.ones(B, T, dtype=torch.bool)
q = torch.randn(B, T, H, D)
assert cpu_kernel.available()
evict = os.environ.get("EVICT", "1") == "1"
big = torch.empty(64 << 20, dtype=torch.uint8)


def once():
    for kc, vc in layers:
        cpu_kernel._paged_attention(q, kc, vc, table, positions, valid)


q1, med, q3 = quartiles(once, before=(lambda: big.add_(1)) if evict else None)
mb = L * B * (ctx + T) * Hkv * D * 2 * 4 / 1e6
print(f"B={B} T={T} {L} layers: median {med:.2f} ms (q1 {q1:.2f}, q3 {q3:.2f}); "
      f"{mb:.1f} MB of keys and values, {mb / med:.1f} GB/s")
