"""RMSNorm, and the residual add before it, in one C call on the CPU (mtpx/kernels/rms_norm.c).

Eager, a [64, 128] RMSNorm is five torch ops of about 20 us each on one AVX2 core, against a few
us of work; a plain decode step of the demo runs 81 of them (experiments/lean_step/norm).
`RMSNorm.forward` calls `rms_norm` where `runs` says so and keeps its torch ops everywhere else
(gradients, other dtypes, CUDA, torch.compile, which fuses them itself) and as the reference:
`use_kernel = False` forces them.
"""
from __future__ import annotations

import ctypes

import torch

from mtpx.kernels import build

use_kernel = True
_fn = None


def available() -> bool:
    """Whether the kernel is built and loaded (builds it on the first call: mtpx.kernels.build)."""
    global _fn
    if _fn is None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        _fn = build.function("rms_norm", [p, i64, p, i64, p, i64, p, i64, ctypes.c_float, p, i64, i64, i64, i64])
    return _fn is not None


def runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `rms_norm` runs: eager (not traced), no gradients, float32 CPU x and a contiguous
    float32 CPU weight, and a built kernel."""
    return (use_kernel and not torch.compiler.is_compiling() and not torch.is_grad_enabled()
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu"
            and weight.is_contiguous() and available())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """x [..., dim] float32 (and residual of x's shape) -> (s, RMSNorm(s)) with s = x + residual
    (None without residual, s = x), both contiguous [..., dim] (mtpx/kernels/rms_norm.c)."""
    dim = x.shape[-1]
    x2 = x.contiguous()
    rows = x2.numel() // dim
    out = torch.empty_like(x2)
    s = res = None
    if residual is not None:
        res, s = residual.contiguous(), torch.empty_like(x2)
    _fn(x2.data_ptr(), dim, None if res is None else res.data_ptr(), dim, None if s is None else s.data_ptr(), dim,
        weight.data_ptr(), int(unit_offset), eps, out.data_ptr(), dim, rows, dim,
        max(1, min(torch.get_num_threads(), rows * dim >> 16)))
    return s, out
