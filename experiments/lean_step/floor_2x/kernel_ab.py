"""What attn_ab.py and gdn_ab.py share: two versions of one kernel source built with mtpx's
flags into a temporary folder and loaded side by side, and their calls alternated."""
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from mtpx.kernels import build  # noqa: E402


def load_versions(sources: list[str], name: str, argtypes: list) -> list:
    """The C function `name` of each source file, built as mtpx builds its kernels (each with the
    headers beside it)."""
    tmp, fns = tempfile.mkdtemp(), []
    for i, src in enumerate(sources):
        so = f"{tmp}/v{i}.so"
        subprocess.run(["cc", *build.COMPILE_FLAGS, f"-I{Path(src).resolve().parent}", "-shared", src, "-o",
                        so, "-lm"],
                       check=True)
        fn = getattr(ctypes.CDLL(so), name)
        fn.argtypes = argtypes
        fns.append(fn)
    return fns


def alternate(run, before=None, pairs: int = 50, warmup: int = 10) -> tuple[float, float, float]:
    """run(i) for version i = 0, 1, alternated (the order swapped every pair), before() ahead of
    each timed call -> (A ms, B ms, B / A), medians over `pairs` pairs after `warmup`."""
    ts = [[], []]
    for it in range(warmup + pairs):
        for i in (0, 1) if it % 2 == 0 else (1, 0):
            if before is not None:
                before()
            t = time.perf_counter()
            run(i)
            ts[i].append(time.perf_counter() - t)
    a, b = (statistics.median(t[warmup:]) * 1e3 for t in ts)
    return a, b, statistics.median([y / x for x, y in zip(ts[0][warmup:], ts[1][warmup:])])
