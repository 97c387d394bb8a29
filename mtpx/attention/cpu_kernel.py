"""Paged attention of short query windows on the CPU, read from the paged cache in place.

`mtpx/kernels/paged_attention.c` reads each key and value once, from its block, for every query of
the window that reaches it (its doc). The torch reference (`torch_backend.cached_attention`)
gathers every key and value of a request into a fresh [B, L, Hkv, D] tensor and calls
scaled_dot_product_attention, whose CPU kernel is built for long queries (the costs of both:
docs/engine.md, "The CPU kernels"). Built on first use (mtpx.kernels.build); without a compiler
`available()` is False and the reference runs. `paged_attention` is the custom op
`mtpx::paged_attention` under torch.compile, so a compiled graph calls it as one opaque kernel.
"""
from __future__ import annotations

import ctypes

import torch

from mtpx.kernels import build, torch_ops

MAX_WINDOW = 32        # longer windows (prefill chunks) keep scaled_dot_product_attention
_fn = None


def available() -> bool:
    """Whether the kernel is built and loaded (builds it on the first call: mtpx.kernels.build)."""
    global _fn
    if _fn is None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        _fn = build.function("paged_attention",
                             [p, p, p, p, i64, p, p, p] + [i64] * 6 + [ctypes.c_float, i64])
    return _fn is not None


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
    status = _fn(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(), block_table.stride(0),
        positions.data_ptr(), valid.data_ptr(), out.data_ptr(), B, T, H, k_cache.shape[2], D,
        k_cache.shape[1], D ** -0.5, torch.get_num_threads())
    if status:
        raise MemoryError("mtpx::paged_attention: out of memory for the kernel's scratch")
    return out


def _paged_attention_fake(q, k_cache, v_cache, block_table, positions, valid):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


torch_ops.define("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, "
                 "Tensor positions, Tensor valid) -> Tensor", _paged_attention, _paged_attention_fake)
