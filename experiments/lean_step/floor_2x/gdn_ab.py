"""Two versions of mtpx/kernels/gdn_decode.c in one process, alternated call by call: 64 requests,
L layers of the demo's shapes (nk 2, nv 4, dk = dv = 32, conv 4), in place; EVICT 1 writes a 64 MB
buffer before each timed call (the states come from memory). Each version is built with mtpx's
flags (kernel_ab.py).

    OMP_NUM_THREADS=1 python gdn_ab.py A.c B.c [L] [EVICT]   (default 24 layers, no eviction)
"""
import ctypes
import sys

import torch

from kernel_ab import alternate, load_versions

torch.set_num_threads(1)
p, i64 = ctypes.c_void_p, ctypes.c_int64
libs = load_versions(sys.argv[1:3], "gdn_decode",
                     [p, i64, p, i64, p, p, p, p, p, i64, p, p, p, p, p, ctypes.c_float, p]
                     + [i64] * 7)
L = int(sys.argv[3]) if len(sys.argv) > 3 else 24
evict = len(sys.argv) > 4 and sys.argv[4] == "1"
B, nk, nv, dk, dv, K = 64, 2, 4, 32, 32, 4
C, F = 2 * nk * dk + nv * dv, 2 * nk * dk + 2 * nv * dv
torch.manual_seed(0)
layers = [dict(conv=torch.randn(B + 2, C, K - 1), ssm=torch.randn(B + 2, nv, dk, dv) * 0.1,
               w=torch.randn(C, K) * 0.3, A=torch.randn(nv) * 0.1, dt=torch.randn(nv) * 0.1,
               nw=torch.ones(dv))
          for _ in range(L)]
x, gates = torch.randn(B, F), torch.randn(B, 2 * nv)
rows, valid = torch.arange(B) + 1, torch.ones(B, dtype=torch.bool)
out = torch.empty(B, nv * dv)
big = torch.empty(64 << 20, dtype=torch.uint8)


def once(fn):
    for d in layers:
        fn(x.data_ptr(), x.stride(0), gates.data_ptr(), gates.stride(0), d["w"].data_ptr(),
           d["conv"].data_ptr(), d["ssm"].data_ptr(),
           d["conv"].data_ptr(), d["ssm"].data_ptr(), 0, rows.data_ptr(), valid.data_ptr(), d["A"].data_ptr(),
           d["dt"].data_ptr(), d["nw"].data_ptr(), 1e-6, out.data_ptr(), B, nk, nv, dk, dv, K, 1)


def before():
    for d in layers:
        d["ssm"].mul_(0.5)                     # keep the states bounded
    if evict:
        big.add_(1)


a, b, r = alternate(lambda i: once(libs[i]), before)
print(f"gdn_decode, {L} layers, evicted={evict}: A {a:.3f} ms, B {b:.3f} ms, B/A paired {r:.3f} (50 pairs)")
