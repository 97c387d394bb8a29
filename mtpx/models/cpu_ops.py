"""Pointwise spans of the eager CPU forward in one C call each: RMSNorm with the residual add
before it (mtpx/kernels/rms_norm.c), SwiGLU's silu(gate) * up (mtpx/kernels/silu_and_mul.c) and
attention's per-head q / k norms with their rotary embedding (mtpx/kernels/qk_norm_rope.c); and a
linear layer over at most LINEAR_MAX_ROWS rows (mtpx/kernels/linear.c, mtpx/models/linear.py).

Eager, each of these spans is several small torch ops whose dispatch costs more than their work
(measured: docs/engine.md, "The CPU kernels"). RMSNorm.forward, MLP.forward and
GatedAttention.forward call these where `runs` says so (the engine's eager CPU inference) and
keep their torch ops everywhere else (training and its evaluations, other dtypes, CUDA,
torch.compile, which fuses them itself) and as the reference: `use_kernel = False` forces them.
"""
from __future__ import annotations

import ctypes

import torch

from mtpx.kernels import build, torch_ops

use_kernel = True
LINEAR_MAX_ROWS = 64     # more rows: the BLAS's GEMM (F.linear) is as fast (experiments/lean_step/floor_2x)
LINEAR_PARALLEL_MACS = 1 << 21   # with several threads, larger linears take the BLAS's threads
_fn = _act = _qk = _lin = None


def available() -> bool:
    """Whether the kernels are built and loaded (builds them on the first call: mtpx.kernels.build)."""
    global _fn, _act, _qk, _lin
    if _fn is None or _act is None or _qk is None or _lin is None:
        p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        _fn = build.function("rms_norm", [p, i64, p, i64, p, i64, p, i64, f32, p, i64, i64, i64, i64])
        _act = build.function("silu_and_mul", [p, p, p, i64, i64, i64])
        _qk = build.function("qk_norm_rope",
                             [p, i64, i64, p, i64, i64, p, p, i64, f32, p, p, p, p] + [i64] * 6)
        _lin = build.function("linear", [p, i64, p, p, p, i64, i64, i64, i64])
    return _fn is not None and _act is not None and _qk is not None and _lin is not None


def runs(x: torch.Tensor, weight: torch.Tensor | None = None, other: torch.Tensor | None = None) -> bool:
    """Whether the kernels run on x (with weight, and `other`: the residual or up operand): the
    engine's inference (torch.inference_mode, eager: not traced; training and its no_grad
    evaluations keep the torch ops, so a loss never depends on the grad mode), float32 CPU
    tensors, `other` of x's shape, a contiguous weight, and built kernels."""
    # is_compiling first: Dynamo cannot trace is_inference_mode_enabled
    return (use_kernel and not torch.compiler.is_compiling() and torch.is_inference_mode_enabled()
            and x.dtype == torch.float32 and x.device.type == "cpu"
            and (weight is None or weight.dtype == torch.float32 and weight.is_contiguous())
            and (other is None or other.dtype == torch.float32 and other.shape == x.shape
                 and other.device.type == "cpu") and available())


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
    _fn(x2.data_ptr(), dim, None if res is None else res.data_ptr(), dim, None if s is None else s.data_ptr(),
        dim, weight.data_ptr(), int(unit_offset), eps, out.data_ptr(), dim, rows, dim,
        max(1, min(torch.get_num_threads(), rows * dim >> 16)))
    return s, out


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [..., n] float32, the same shape -> silu(gate) * up, contiguous, each row's result
    independent of the other rows (mtpx/kernels/silu_and_mul.c)."""
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    n = gate.shape[-1]
    rows = gate.numel() // max(1, n)
    _act(gate.data_ptr(), up.data_ptr(), out.data_ptr(), rows, n,
         max(1, min(torch.get_num_threads(), rows * n >> 16)))
    return out


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None,
                 k_weight: torch.Tensor | None, eps: float, unit_offset: bool, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [..., H, D], k [..., Hkv, D] float32 (unit stride over D; q may be a strided view), their
    RMSNorm weights [D] (None: no norm, both or neither), cos, sin [..., R] (R even, at most D;
    the same leading dims) -> (apply_rope(norm(q)), apply_rope(norm(k))), contiguous
    (mtpx/kernels/qk_norm_rope.c)."""
    H, Hkv, D, R = q.shape[-2], k.shape[-2], q.shape[-1], cos.shape[-1]
    q2, k2 = q.reshape(-1, H, D), k.reshape(-1, Hkv, D)       # views where the leading dims merge
    if q2.stride(2) != 1:
        q2 = q2.contiguous()
    if k2.stride(2) != 1:
        k2 = k2.contiguous()
    c, s = cos.reshape(-1, R).contiguous(), sin.reshape(-1, R).contiguous()
    N = q2.shape[0]
    q_out, k_out = q.new_empty(q.shape), k.new_empty(k.shape)
    _qk(q2.data_ptr(), q2.stride(0), q2.stride(1), k2.data_ptr(), k2.stride(0), k2.stride(1),
        None if q_weight is None else q_weight.data_ptr(), None if k_weight is None else k_weight.data_ptr(),
        int(unit_offset), eps, c.data_ptr(), s.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), N, H, Hkv, D,
        R, max(1, min(torch.get_num_threads(), N * (H + Hkv) * D >> 16)))
    return q_out, k_out


def _one_thread() -> bool:
    """torch runs one thread."""
    return torch.get_num_threads() == 1


def _linear_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """At most LINEAR_MAX_ROWS rows, and with more than one torch thread less than
    LINEAR_PARALLEL_MACS multiply-adds: the kernel runs on one thread, and above that the BLAS's
    threads are faster (2 threads, batch 64: the step 1.20x with the kernel)."""
    return x.numel() <= LINEAR_MAX_ROWS * x.shape[-1] and (
        x.numel() * weight.shape[0] < LINEAR_PARALLEL_MACS or _one_thread())


def linear_runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs x [..., in] through weight [out, in]: `runs` (eager inference, float32
    CPU, a contiguous weight) and `_linear_fits`."""
    return _linear_fits(x, weight) and runs(x, weight)


def linear_op_runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Under torch.compile: whether the graph calls the operator mtpx::linear for x and weight
    (`runs`' conditions, with gradients off in place of inference mode, which Dynamo cannot trace,
    and a kernel library loaded already: a traced forward cannot build it). The number of rows is
    not looked at here: the operator chooses between the kernel and F.linear when it runs
    (`_linear_or_blas`), so a graph with a dynamic batch size has no guard on it: with a guard
    `rows <= 64` inside the engine's nested compile regions Dynamo failed (KeyError) on a fresh
    cache when the batch size crossed it."""
    return (use_kernel and not torch.is_grad_enabled()
            and x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu"
            and weight.is_contiguous() and build.loaded())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., in] float32 (any strides), weight [out, in] contiguous,
    bias [out] or None -> [..., out] contiguous (mtpx/kernels/linear.c): each row's result the
    same whatever the other rows."""
    n_in, n_out = x.shape[-1], weight.shape[0]
    if not x.is_contiguous():
        x = x.contiguous()
    rows = x.numel() // n_in
    y = x.new_empty(x.shape[:-1] + (n_out,))
    _lin(x.data_ptr(), n_in, weight.data_ptr(), None if bias is None else bias.contiguous().data_ptr(),
         y.data_ptr(), rows, n_out, n_in, 1)
    return y


def _linear_or_blas(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """mtpx::linear: `linear` where `_linear_fits`, else F.linear (both as eager's `Linear`)."""
    if _linear_fits(x, weight):
        return linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def _linear_fake(x, weight, bias):
    return x.new_empty(x.shape[:-1] + (weight.shape[0],))


torch_ops.define("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor", _linear_or_blas, _linear_fake)
