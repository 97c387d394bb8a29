"""The torch attention backend: the CPU reference for cached causal attention.

Writes the new keys/values of the real tokens into their rows at their positions, then attends each
query to the keys of its row at positions <= its own position, with scaled_dot_product_attention
(grouped-query heads via enable_gqa).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mtpx.cache.state import KVCache
from mtpx.models.meta import ForwardMeta


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """No cache (training): q [B, T, H, D], k, v [B, T, Hkv, D] -> [B, T, H, D]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True, enable_gqa=True)
    return out.transpose(1, 2)


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                     meta: ForwardMeta) -> torch.Tensor:
    """q [B, T, H, D], k, v [B, T, Hkv, D] of the new tokens -> [B, T, H, D].

    Keys come from `cache` rows `meta.rows`, positions 0 .. meta.kv_len - 1, after writing the new
    ones. Padding queries (valid False) attend position 0 only and their output is garbage.
    """
    B, T = meta.valid.shape
    rows = meta.rows[:, None].expand(B, T)[meta.valid]
    pos = meta.positions[meta.valid]
    cache.k[rows, pos] = k[meta.valid].to(cache.k.dtype)
    cache.v[rows, pos] = v[meta.valid].to(cache.v.dtype)
    keys = cache.k[meta.rows, : meta.kv_len].transpose(1, 2)          # [B, Hkv, S, D]
    values = cache.v[meta.rows, : meta.kv_len].transpose(1, 2)
    key_pos = torch.arange(meta.kv_len, device=q.device)
    mask = key_pos[None, None, None, :] <= meta.positions[:, None, :, None]  # [B, 1, T, S]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype),
                                         attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2)
