"""Build and load mtpx's C kernels (this package's *.c) into one shared library.

The sources are compiled on first use with the system C compiler ($CC, else cc) into
$MTPX_CACHE_DIR/kernels/ (keyed by the sources, the flags, the compiler and the CPU model, since
they are built with -march=native), renamed into place atomically, and loaded with ctypes, which
releases the GIL during a call. Without a compiler, or when the build fails, `load()` returns None
and one warning says why; callers then run their torch reference.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

from mtpx.io import cache_dir_line, cache_dir_problem, mtpx_cache_dir

SOURCES = sorted(Path(__file__).parent.glob("*.c"))
HEADERS = sorted(Path(__file__).parent.glob("*.h"))
# -ffast-math lets GCC call glibc's vector expf (libmvec) in the loops. It is given when compiling
# only: linked with it, GCC adds crtfastmath.o, which would flush denormals to zero in the whole
# process. The kernels do not rely on infinities or NaNs.
BASE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fPIC", "-pthread"]
COMPILE_FLAGS = list(BASE_FLAGS)
if platform.machine() in ("x86_64", "AMD64"):
    # GCC's Zen 1 tuning would use 128-bit vectors, and split 256-bit stores in two, which the next
    # 256-bit load of the same address cannot be forwarded from
    COMPILE_FLAGS += ["-mprefer-vector-width=256", "-mno-avx256-split-unaligned-store",
                      "-mno-avx256-split-unaligned-load"]
LINK_FLAGS = ["-shared", "-pthread", "-lm"]
BUILD_BYTES = 16 * 2**20         # free space a build needs (its objects and library: about 1 MB)

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failed: str | None = None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or (os.sep in cc and not os.path.exists(cc)):
        raise RuntimeError(f"no C compiler found ({cc or 'cc'}; set CC, or install gcc)")
    parts = ([s.read_text() for s in SOURCES + HEADERS]
             + [" ".join(COMPILE_FLAGS + LINK_FLAGS), _cpu_model(), cc])
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]
    path = mtpx_cache_dir() / "kernels" / f"mtpx_kernels_{key}.so"
    if path.exists():
        return ctypes.CDLL(str(path))
    problem = cache_dir_problem(path.parent, BUILD_BYTES)
    if problem is not None:          # build in a temporary folder, not kept: one line says so
        print(cache_dir_line(path.parent, problem, "the CPU kernels are built in a temporary folder (again "
                             "next run)"), file=sys.stderr, flush=True)
        path = Path(tempfile.mkdtemp(prefix="mtpx-kernels-")) / path.name
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        try:
            try:
                _compile(cc, COMPILE_FLAGS, Path(tmp))
            except RuntimeError:
                _compile(cc, BASE_FLAGS, Path(tmp))        # a compiler without GCC's x86 tuning flags
        except RuntimeError as err:     # a full disk shows as a missing object file: name the cause
            if (low := cache_dir_problem(tmp, BUILD_BYTES)) is not None:
                raise RuntimeError(f"building in {path.parent} failed: {low}") from err
            raise
        os.replace(Path(tmp) / "k.so", path)
    return ctypes.CDLL(str(path))


def _compile(cc: str, flags: list[str], tmp: Path) -> None:
    objs = []
    for src in SOURCES:
        objs.append(str(tmp / (src.stem + ".o")))
        _run([cc, *flags, "-c", str(src), "-o", objs[-1]], cc)
    _run([cc, *objs, *LINK_FLAGS, "-o", str(tmp / "k.so")], cc)


def _run(cmd: list[str], cc: str) -> None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as err:
        raise RuntimeError(f"{cc} could not run: {err}") from None
    if res.returncode != 0:
        err = res.stderr.strip().splitlines()
        raise RuntimeError(f"{cc} failed: {err[-1] if err else res.returncode}")


def function(name: str, argtypes: list):
    """The kernel `name` of the built library with its ctypes signature (int status return), or
    None without a compiler (`load`)."""
    lib = load()
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


def loaded() -> bool:
    """Whether the library is loaded (no build, no ctypes: callable inside a traced forward)."""
    return _lib is not None


def load() -> ctypes.CDLL | None:
    """The built library, or None without a compiler (module doc); built once per process."""
    global _lib, _failed
    if _lib is not None or _failed is not None:
        return _lib
    with _lock:
        if _lib is None and _failed is None:
            try:
                _lib = _build()
            except (OSError, RuntimeError) as err:
                _failed = str(err)
                warnings.warn(f"mtpx: the CPU kernels are unavailable ({_failed}); the torch references run",
                              stacklevel=2)
    return _lib
