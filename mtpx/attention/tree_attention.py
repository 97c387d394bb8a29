"""Tree attention over the paged KV cache: the attention backend of a forward over a tree of draft
tokens (tree verification, tree drafting; mtpx/spec_decode/tree.py).

The forward's tokens are tree nodes. Node i of request b writes its keys and values at the slot of
position base[b] + i (meta.positions holds those slot positions; RoPE uses each node's own
position, which the caller computes) and attends to

    the keys at positions < prefix_end[b] (the request's committed KV), and
    the keys at positions base[b] + j for every node j that is node i or one of its ancestors
    (ancestors [B, T, S], S nodes from base on).

Everything else (siblings, other branches, stale positions between prefix_end and base) is
masked. The reference gather and SDPA of mtpx/attention/torch_backend.py, with that mask in place
of the causal one (SpecInfer's tree attention, Miao et al. 2024, arXiv 2305.09781).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mtpx.attention.kv_cache import KVCache
from mtpx.attention import tree_kernel
from mtpx.attention.meta import ForwardMeta
from mtpx.attention.torch_backend import gather_kv


class TreeAttention:
    """An attention backend (mtpx.attention.backend interface) for one tree forward.

    prefix_end, base: [B] int64; ancestors: [B, T, S] bool, query token t may read node s's key
    (the key at position base + s)."""

    name = "tree"

    def __init__(self, prefix_end: torch.Tensor, base: torch.Tensor, ancestors: torch.Tensor):
        self.prefix_end, self.base, self.ancestors = prefix_end, base, ancestors

    def plan(self, meta: ForwardMeta) -> None:
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                meta: ForwardMeta) -> torch.Tensor:
        """q [B, T, H, D], k, v [B, T, Hkv, D] -> [B, T, H, D] (module doc); padding queries
        (meta.valid False) write nothing and return garbage."""
        if meta.static:        # compiled (mtpx/engine/compiled_tree.py): padding nodes map to the pad slot
            cache.write(meta.slot_mapping.flatten(), k.flatten(0, 1), v.flatten(0, 1))
        else:
            cache.write(meta.slot_mapping[meta.valid], k[meta.valid], v[meta.valid])
        if tree_kernel.supports(q, cache.k):          # the C kernel (mtpx.attention.tree_kernel)
            return tree_kernel.tree_attention(q, cache.k, cache.v, meta.block_table, self.ancestors,
                                              self.base, self.prefix_end, meta.valid)
        S = self.ancestors.shape[-1]
        kv_len = None if meta.static else int((self.base + S).max())     # static: the whole block table
        keys, values = gather_kv(cache, meta.block_table, kv_len)
        pos = torch.arange(keys.shape[1], device=q.device)
        rel = pos[None] - self.base[:, None]                                         # [B, L]
        in_tree = (rel >= 0) & (rel < S)
        tree = self.ancestors.gather(2, rel.clamp(0, S - 1)[:, None].expand(-1, q.shape[1], -1))
        mask = (pos[None, None] < self.prefix_end[:, None, None]) | (in_tree[:, None] & tree)   # [B, T, L]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2).to(q.dtype),
                                             values.transpose(1, 2).to(q.dtype), attn_mask=mask[:, None],
                                             enable_gqa=True)
        return out.transpose(1, 2)


def node_meta(block_table: torch.Tensor, block_size: int, rows: torch.Tensor, base: torch.Tensor,
              nodes: torch.Tensor, valid: torch.Tensor, prefix_end: torch.Tensor,
              ancestors: torch.Tensor, gdn_backend: str = "auto") -> ForwardMeta:
    """The ForwardMeta of a tree forward: token t of request b is node nodes[b, t] ([B, T] int64),
    whose KV goes to the slot of position base[b] + nodes[b, t]; block_table [B, max_blocks] of
    the requests (rows [B]); valid [B, T] bool; prefix_end [B], ancestors [B, T, S]: TreeAttention's."""
    positions = base[:, None] + nodes
    slots = block_table.gather(1, positions // block_size) * block_size + positions % block_size
    kv_len = int((base + ancestors.shape[-1]).max())
    meta = ForwardMeta(positions, valid, rows, kv_len, block_table, block_size, slots,
                       gdn_backend=gdn_backend)
    meta.attn_backend = TreeAttention(prefix_end, base, ancestors)
    return meta
