"""The torch attention backend: the CPU reference for paged causal attention.

Writes the new keys/values of the real tokens into their paged slots (meta.slot_mapping), gathers
each request's keys from its block table for positions 0 .. kv_len - 1, and attends each query to
the keys at positions <= its own with scaled_dot_product_attention (grouped-query heads via
enable_gqa). Keys beyond a request's own length come from whatever blocks the table pads with and
are masked out, so they are never read.

On the CPU, windows of at most cpu_kernel.MAX_WINDOW float32 tokens (decode steps, verification
windows) run mtpx.attention.cpu_kernel instead, which reads the keys and values from their blocks
in place; the gather and SDPA above stay its reference (`use_kernel = False` forces them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mtpx.attention import cpu_kernel
from mtpx.attention.kv_cache import KVCache
from mtpx.attention.meta import ForwardMeta


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """No cache (training): q [B, T, H, D], k, v [B, T, Hkv, D] -> [B, T, H, D]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True, enable_gqa=True)
    return out.transpose(1, 2)


_scratch: dict = {}   # (dtype, device) -> [keys, values] flat buffers that gather_kv(reuse=True) reuses
reuse_scratch = True  # cached_attention gathers into the scratch buffers (eager, CPU)
use_kernel = True     # short float32 CPU windows run cpu_kernel.paged_attention (module doc)


def _scratch_views(cache: KVCache, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [n, block_size, Hkv, D] views of this module's scratch buffers (grown as needed)."""
    shape = (n, *cache.k.shape[1:])
    numel = n * cache.k[0].numel()
    key = (cache.k.dtype, cache.k.device)
    bufs = _scratch.get(key)
    # a buffer made under inference_mode cannot be written outside it (and the other way round)
    if bufs is None or bufs[0].numel() < numel or bufs[0].is_inference() != torch.is_inference_mode_enabled():
        bufs = _scratch[key] = [torch.empty(numel, dtype=cache.k.dtype, device=cache.k.device)
                                for _ in range(2)]
    return bufs[0][:numel].view(shape), bufs[1][:numel].view(shape)


def gather_kv(cache: KVCache, block_table: torch.Tensor, kv_len: int | None, reuse: bool = False):
    """Keys and values of positions 0 .. kv_len - 1 of each request: block_table [B, max_blocks]
    -> (k, v) [B, kv_len, Hkv, D] (kv_len None: every block of the table, [B, max_blocks *
    block_size, Hkv, D]). reuse: eager and without gradients, gather into this module's scratch buffers
    instead of fresh tensors (no new pages per call; at batch 64 a layer gathers 2 x 3.4 MB): the result
    is valid until the next reuse call, so only a caller done with it by then may ask."""
    S = cache.block_size
    if kv_len is None:
        kv_len = block_table.shape[1] * S
    nb = -(-kv_len // S)
    ids = block_table[:, :nb]
    B = ids.shape[0]
    if torch.compiler.is_compiling():
        # Inductor writes its own gather either way; a reshape of the [B, blocks] table inside a
        # compiled layer region would make it guard on B != 1 (a batch of one compiling again)
        return (cache.k[ids].flatten(1, 2)[:, :kv_len], cache.v[ids].flatten(1, 2)[:, :kv_len])
    # index_select, not cache.k[ids]: the same gather, 4.7-7.3x faster on the CPU (advanced
    # indexing runs ATen's element-wise index kernel; experiments/step_costs/batch64_window)
    flat = ids.reshape(-1)
    if (reuse and cache.k.dtype == cache.v.dtype and cache.k.shape == cache.v.shape
            and not (cache.k.requires_grad or cache.v.requires_grad)):
        k, v = _scratch_views(cache, flat.shape[0])
        k, v = torch.index_select(cache.k, 0, flat, out=k), torch.index_select(cache.v, 0, flat, out=v)
    else:
        k, v = cache.k.index_select(0, flat), cache.v.index_select(0, flat)
    return (k.view(B, nb * S, *cache.k.shape[2:])[:, :kv_len],
            v.view(B, nb * S, *cache.v.shape[2:])[:, :kv_len])


class TorchBackend:
    """The reference backend (mtpx.attention.backend interface): no plan, `cached_attention`."""

    name = "torch"

    def __init__(self):
        if use_kernel:
            cpu_kernel.available()      # build the CPU kernel now, not inside a traced forward

    def plan(self, meta: ForwardMeta) -> None:
        return None

    def forward(self, q, k, v, cache: KVCache, meta: ForwardMeta) -> torch.Tensor:
        return cached_attention(q, k, v, cache, meta)


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                     meta: ForwardMeta) -> torch.Tensor:
    """q [B, T, H, D], k, v [B, T, Hkv, D] of the new tokens -> [B, T, H, D].

    Writes k, v of the valid tokens at meta.slot_mapping, then attends to positions
    0 .. meta.kv_len - 1 of each request's blocks. Padding queries (valid False) attend position 0
    only and their output is garbage. A static meta (kv_len None) writes every token (padding
    lands in the pad slot) and reads every block of its block table: no shape depends on a value.
    """
    if meta.static:
        cache.write(meta.slot_mapping.reshape(-1), k.flatten(0, 1), v.flatten(0, 1))
    else:
        cache.write(meta.slot_mapping[meta.valid], k[meta.valid], v[meta.valid])
    if use_kernel and cpu_kernel.supports(q, cache.k):
        return cpu_kernel.paged_attention(q, cache.k, cache.v, meta.block_table, meta.positions, meta.valid)
    keys, values = gather_kv(cache, meta.block_table, meta.kv_len, reuse=reuse_scratch)   # used up below
    key_pos = torch.arange(keys.shape[1], device=q.device)
    mask = key_pos[None, None, None, :] <= meta.positions[:, None, :, None]  # [B, 1, T, S]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2).to(q.dtype),
                                         values.transpose(1, 2).to(q.dtype), attn_mask=mask,
                                         enable_gqa=True)
    return out.transpose(1, 2)
