"""Paged attention of short query windows on the CPU, read from the paged cache in place.

The torch reference (`torch_backend.cached_attention`) gathers every key and value of a request
into a fresh [B, L, Hkv, D] tensor and calls scaled_dot_product_attention, whose CPU kernel is
built for long queries: at batch 64, one query of 4 heads over 208 keys of head dim 32 costs
about 2 ms of gather and 2.7 ms of SDPA on one AVX2 core, where reading the keys and values once
takes about 0.7 ms (experiments/lean_step). `paged_attention.c` reads each key and value once,
from its block, for every query of the window that reaches it (module doc there).

The C source is built on first use with the system C compiler ($CC, else cc) into
$MTPX_CACHE_DIR/kernels/ (keyed by the source, the flags and the CPU model, `-march=native`),
renamed into place atomically, and loaded with ctypes (which releases the GIL). Without a
compiler, or if the build fails, `available()` is False, one warning says why and the torch
reference runs. `paged_attention` is the custom op `mtpx::paged_attention`, so a compiled graph
calls it as one opaque kernel.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from mtpx.io import mtpx_cache_dir

SOURCE = Path(__file__).with_name("paged_attention.c")
# -ffast-math lets GCC call glibc's vector expf (libmvec) in the softmax: a scalar expf per score
# was most of the kernel's time. It is given when compiling only: linked with it, GCC adds
# crtfastmath.o, which would flush denormals to zero in the whole process.
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fPIC", "-pthread"]
if platform.machine() in ("x86_64", "AMD64"):
    # GCC's Zen 1 tuning would use 128-bit vectors, and split 256-bit stores in two, which the next
    # 256-bit load of the same address cannot be forwarded from
    COMPILE_FLAGS += ["-mprefer-vector-width=256", "-mno-avx256-split-unaligned-store",
                      "-mno-avx256-split-unaligned-load"]
LINK_FLAGS = ["-shared", "-pthread", "-lm"]
MAX_WINDOW = 32        # longer windows (prefill chunks) keep scaled_dot_product_attention

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
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    key = hashlib.sha256("\n".join([SOURCE.read_text(), " ".join(COMPILE_FLAGS + LINK_FLAGS), _cpu_model(), cc])
                         .encode()).hexdigest()[:20]
    path = mtpx_cache_dir() / "kernels" / f"paged_attention_{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            obj, lib = Path(tmp) / "k.o", Path(tmp) / "k.so"
            for cmd in ([cc, *COMPILE_FLAGS, "-c", str(SOURCE), "-o", str(obj)], [cc, str(obj), *LINK_FLAGS, "-o", str(lib)]):
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    err = res.stderr.strip().splitlines()
                    raise RuntimeError(f"{cc} failed: {err[-1] if err else res.returncode}")
            os.replace(lib, path)
    lib = ctypes.CDLL(str(path))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.paged_attention.argtypes = [p, p, p, p, i64, p, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, i64]
    lib.paged_attention.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the kernel is built and loaded (builds it on the first call; module doc)."""
    global _lib, _failed
    if _lib is not None:
        return True
    if _failed is not None:
        return False
    with _lock:
        if _lib is None and _failed is None:
            try:
                _lib = _build()
            except (OSError, RuntimeError) as err:
                _failed = str(err)
                warnings.warn(f"mtpx: the CPU paged-attention kernel is unavailable ({_failed}); "
                              "attention runs the torch reference", stacklevel=2)
    return _lib is not None


def supports(q: torch.Tensor, cache_k: torch.Tensor) -> bool:
    """Whether `paged_attention` runs this call: float32 CPU tensors, no gradient, a window of at
    most MAX_WINDOW tokens, and a built kernel."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and cache_k.dtype == torch.float32
            and q.shape[1] <= MAX_WINDOW and not (torch.is_grad_enabled() and q.requires_grad)
            and available())


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """q [B, T, H, D] float32; k_cache, v_cache [num_blocks, block_size, Hkv, D] float32;
    block_table [B, blocks] int64 (at least the blocks of positions 0 .. max position); positions
    [B, T] int64; valid [B, T] bool -> [B, T, H, D]: query (b, t) over request b's positions
    0 .. positions[b, t] with scale D^-0.5, grouped-query heads as SDPA's enable_gqa (a padding
    query attends position 0). Raises MemoryError when the kernel's scratch cannot be allocated.
    Under torch.compile this is the custom op mtpx::paged_attention (one opaque call in the
    graph); eager it calls the kernel directly (the op's dispatch cost about 0.3 ms a call)."""
    if torch.compiler.is_compiling():
        return torch.ops.mtpx.paged_attention(q, k_cache, v_cache, block_table, positions, valid)
    return _paged_attention(q, k_cache, v_cache, block_table, positions, valid)


def _paged_attention(q, k_cache, v_cache, block_table, positions, valid):
    B, T, H, D = q.shape
    q = q.contiguous()
    block_table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    positions, valid = positions.contiguous(), valid.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    status = _lib.paged_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(), block_table.stride(0),
        positions.data_ptr(), valid.data_ptr(), out.data_ptr(), B, T, H, k_cache.shape[2], D, k_cache.shape[1],
        D ** -0.5, torch.get_num_threads())
    if status:
        raise MemoryError("mtpx::paged_attention: out of memory for the kernel's scratch")
    return out


@torch.library.custom_op("mtpx::paged_attention", mutates_args=())
def _paged_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return _paged_attention(q, k_cache, v_cache, block_table, positions, valid)


@_paged_attention_op.register_fake
def _(q, k_cache, v_cache, block_table, positions, valid):
    return torch.empty_like(q, memory_format=torch.contiguous_format)
