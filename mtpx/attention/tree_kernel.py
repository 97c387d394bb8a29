"""Tree attention over the paged cache in one C call (mtpx/kernels/paged_attention.c
`paged_tree_attention`): the paged-attention kernel with the tree mask of
mtpx.attention.tree_attention (whose gather and masked SDPA is its reference). Built on first use
(mtpx.kernels.build); without a compiler `available()` is False and the reference runs. Under
torch.compile it is the custom op `mtpx::paged_tree_attention`.
"""
from __future__ import annotations

import ctypes

import torch

from mtpx.kernels import build, torch_ops

use_kernel = True
MAX_WINDOW = 64        # wider trees keep the masked SDPA
_fn = None


def available() -> bool:
    """Whether the kernel is built and loaded (builds it on the first call)."""
    global _fn
    if _fn is None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        _fn = build.function("paged_tree_attention",
                             [p, p, p, p, i64, p, p, p, i64, p, p] + [i64] * 6 + [ctypes.c_float, i64])
    return _fn is not None


def supports(q: torch.Tensor, cache_k: torch.Tensor) -> bool:
    """Whether `tree_attention` runs this call: float32 CPU tensors, no gradient, at most
    MAX_WINDOW nodes, a built kernel (loaded already, under torch.compile)."""
    ready = build.loaded() if torch.compiler.is_compiling() else available()
    return (use_kernel and q.device.type == "cpu" and q.dtype == torch.float32
            and cache_k.dtype == torch.float32 and q.shape[1] <= MAX_WINDOW
            and not (torch.is_grad_enabled() and q.requires_grad) and ready)


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                   ancestors: torch.Tensor, base: torch.Tensor, prefix_end: torch.Tensor,
                   valid: torch.Tensor) -> torch.Tensor:
    """q [B, T, H, D] float32; k_cache, v_cache [num_blocks, block_size, Hkv, D] float32;
    block_table [B, blocks] int64; ancestors [B, T, NT] bool; base, prefix_end [B] int64; valid
    [B, T] bool -> [B, T, H, D]: query (b, t) over the positions < prefix_end[b] and base[b] + j
    for ancestors[b, t, j], scale D^-0.5, grouped-query heads as SDPA's enable_gqa (a padding
    query attends position 0). Raises MemoryError when the kernel's scratch cannot be allocated."""
    fn = torch.ops.mtpx.paged_tree_attention if torch.compiler.is_compiling() else _tree_attention
    return fn(q, k_cache, v_cache, block_table, ancestors, base, prefix_end, valid)


def _tree_attention(q, k_cache, v_cache, block_table, ancestors, base, prefix_end, valid):
    if _fn is None and not available():
        raise RuntimeError("mtpx paged_tree_attention: the CPU kernels are not built")
    B, T, H, D = q.shape
    q = q.contiguous()
    block_table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    anc, valid = ancestors.contiguous(), valid.contiguous()
    base, prefix_end = base.contiguous(), prefix_end.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    status = _fn(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(),
                 block_table.stride(0), anc.data_ptr(), base.data_ptr(), prefix_end.data_ptr(), anc.shape[-1],
                 valid.data_ptr(), out.data_ptr(), B, T, H, k_cache.shape[2], D, k_cache.shape[1], D ** -0.5,
                 torch.get_num_threads())
    if status:
        raise MemoryError("mtpx::paged_tree_attention: out of memory for the kernel's scratch")
    return out


def _tree_attention_fake(q, k_cache, v_cache, block_table, ancestors, base, prefix_end, valid):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


torch_ops.define("paged_tree_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, "
                 "Tensor ancestors, Tensor base, Tensor prefix_end, Tensor valid) -> Tensor",
                 _tree_attention, _tree_attention_fake)
