"""Two versions of mtpx/kernels/paged_attention.c in one process, alternated call by call: B = 64
requests at context 200 over 8 layers' paged caches (blocks of 16, Hkv 2, D 32, H 4: the demo's),
a 64 MB buffer written before each timed call so that keys and values come from memory; the
block table in order, or shuffled (SHUFFLE 1: a server's blocks after requests come and go).
Each version is built with mtpx's flags into a temporary folder; both outputs must be equal.

    OMP_NUM_THREADS=1 python attn_ab.py A.c B.c [T] [SHUFFLE]   (T queries per request, default 1)
"""
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from mtpx.kernels import build  # noqa: E402

torch.set_num_threads(1)
libs = []
TMP = tempfile.mkdtemp()
for i, src in enumerate(sys.argv[1:3]):
    so = f"{TMP}/v{i}.so"
    subprocess.run(["cc", *build.COMPILE_FLAGS, f"-I{Path(src).resolve().parent}", "-shared", src, "-o", so, "-lm"], check=True)
    fn = ctypes.CDLL(so).paged_attention
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, i64, p, p, p] + [i64] * 6 + [ctypes.c_float, i64]
    libs.append(fn)
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
        fn(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), table.data_ptr(), per, positions.data_ptr(), valid.data_ptr(),
           out.data_ptr(), B, T, H, Hkv, D, S, D ** -0.5, 1)
outs = []
for fn in libs:
    once(fn)
    outs.append(out.clone())
assert torch.equal(outs[0], outs[1]), (outs[0] - outs[1]).abs().max()
ts = [[], []]
for it in range(60):
    for i in ((0, 1) if it % 2 == 0 else (1, 0)):
        if not NOEVICT:
            big.add_(1)
        t = time.perf_counter()
        once(libs[i])
        ts[i].append(time.perf_counter() - t)
a, b = (statistics.median(t[10:]) * 1e3 for t in ts)
r = statistics.median([y / x for x, y in zip(ts[0][10:], ts[1][10:])])
print(f"paged attention, T={T} shuffled={shuffle}: A {a:.3f} ms, B {b:.3f} ms, B/A paired {r:.3f} (50 pairs)")
