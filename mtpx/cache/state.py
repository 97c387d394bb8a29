"""Per-layer inference state: a KV cache for attention layers, a recurrent state for Gated DeltaNet.

Both are indexed by a cache *row* (one per running request). The KV cache is contiguous per row
([rows, max_len, kv_heads, head_dim], position p of a request at index p of its row): positions
beyond a request's length may hold stale entries, which attention never reads because a query at
position p only sees keys at positions <= p, all written before (or in) the same forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """k, v: [rows, max_len, num_kv_heads, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    @staticmethod
    def allocate(rows: int, max_len: int, num_kv_heads: int, head_dim: int, dtype, device="cpu"):
        shape = (rows, max_len, num_kv_heads, head_dim)
        return KVCache(torch.zeros(shape, dtype=dtype, device=device),
                       torch.zeros(shape, dtype=dtype, device=device))


@dataclass
class RecurrentState:
    """Gated DeltaNet state of every row.

    conv: [rows, conv_dim, kernel - 1], the last kernel-1 inputs of the short causal conv.
    ssm: [rows, heads, key_dim, value_dim], the delta-rule memory (float32, float64 in fp64 models).
    After a forward with keep_states, `pending_*` hold the state after every token of that forward
    ([B, T, ...]) for `pending_rows`; `commit(index)` selects one per request (invariant 3: a
    rejection selects a state, never re-runs the model).
    """

    conv: torch.Tensor
    ssm: torch.Tensor
    pending_conv: torch.Tensor | None = None
    pending_ssm: torch.Tensor | None = None
    pending_rows: torch.Tensor | None = None

    @staticmethod
    def allocate(rows: int, conv_dim: int, kernel: int, heads: int, key_dim: int, value_dim: int,
                 dtype, device="cpu"):
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        return RecurrentState(torch.zeros(rows, conv_dim, kernel - 1, dtype=dtype, device=device),
                              torch.zeros(rows, heads, key_dim, value_dim, dtype=state_dtype,
                                          device=device))

    def commit(self, index: torch.Tensor) -> None:
        """index: [B] int64, for each pending request the token after which to keep the state
        (0 = after the first token of the window)."""
        if self.pending_rows is None:  # the forward had one token per request: already stored
            return
        b = torch.arange(index.numel(), device=index.device)
        self.conv.index_copy_(0, self.pending_rows, self.pending_conv[b, index])
        self.ssm.index_copy_(0, self.pending_rows, self.pending_ssm[b, index])
        self.pending_conv = self.pending_ssm = self.pending_rows = None

    def reset(self, row: int) -> None:
        self.conv[row].zero_()
        self.ssm[row].zero_()
