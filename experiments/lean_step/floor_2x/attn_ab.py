"""Two versions of mtpx/kernels/paged_attention.c in one process, alternated call by call: B = 64
requests at context 200 over 8 layers' paged caches (blocks of 16, Hkv 2, D 32, H 4: the demo's),
a 64 MB buffer written before each timed call so that keys and values come from memory; the
block table in order, or shuffled (SHUFFLE 1: a server's blocks after requests come and go).
Each version is built with mtpx's flags (kernel_ab.py); both outputs must be equal.

    OMP_NUM_THREADS=1 python attn_ab.py A.c B.c [T] [SHUFFLE]   (T queries per request, default 1)
"""
import ctypes
import os
import sys

import torch

from kernel_ab import alternate, load_versions

torch.set_num_threads(1)
p, i64 = ctypes.c_void_p, ctypes.c_int64
libs = load_versions(sys.argv[1:3], "paged_attention",
                     [p, p, p, p, i64, p, p, p] + [i64] * 6 + [ctypes.c_float, i64])
T = int(sys.argv[3]) if len(sys.argv) > 3 else 1
shuffle = len(sys.argv) > 4 and sys.argv[4] == "1"
B, L, H, Hkv, D, S, ctx = 64, int(os.environ.get("L", 8)), 4, 2, 32, 16, 200
per = (ctx + S) // S + 1
torch.manual_seed(0)
layers = [(torch.randn(B * per + 8, S, Hkv, D), torch.randn(B * per + 8, S, Hkv, D)) for _ in range(L)]
ids = torch.randperm(B * per) if shuffle else torch.arange(B * per)
table = (ids.view(B, per) + 1).contiguous()
positions = torch.full((B, T), ctx, dtype=torch.int64) + torch.arange(T)
valid = torch.ones(B, T, dtype=torch.bool)
q = torch.randn(B, T, H, D)
out = torch.empty_like(q)
NOEVICT = os.environ.get("NOEVICT") == "1"      # 1: no buffer written between calls
big = torch.empty(64 << 20, dtype=torch.uint8)


def once(fn):
    for kc, vc in layers:
        fn(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), table.data_ptr(), per, positions.data_ptr(),
           valid.data_ptr(), out.data_ptr(), B, T, H, Hkv, D, S, D ** -0.5, 1)
outs = []
for fn in libs:
    once(fn)
    outs.append(out.clone())
assert torch.equal(outs[0], outs[1]), (outs[0] - outs[1]).abs().max()
a, b, r = alternate(lambda i: once(libs[i]), None if NOEVICT else (lambda: big.add_(1)))
print(f"paged attention, T={T} shuffled={shuffle}: A {a:.3f} ms, B {b:.3f} ms, B/A paired {r:.3f} (50 pairs)")
