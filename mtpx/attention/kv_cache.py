"""The paged KV cache of one attention layer (vLLM's PagedAttention layout):
[num_blocks, block_size, kv_heads, head_dim], position p of a request in slot
block_table[p // block_size] * block_size + p % block_size."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class KVCache:
    """k, v: [num_blocks, block_size, num_kv_heads, head_dim]. guard(slots) is called before every
    write (tests use it to check that no published prefix-cache block is written)."""

    k: torch.Tensor
    v: torch.Tensor
    guard: Callable[[torch.Tensor], None] | None = None

    @staticmethod
    def allocate(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype,
                 device="cpu"):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return KVCache(torch.zeros(shape, dtype=dtype, device=device),
                       torch.zeros(shape, dtype=dtype, device=device))

    @property
    def block_size(self) -> int:
        return self.k.shape[1]

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: [N] int64 flat slot ids; k, v: [N, kv_heads, head_dim]."""
        if self.guard is not None:
            self.guard(slots)
        # index_copy_, not slot assignment: its source never broadcasts, so under torch.compile it
        # needs no guard on N != 1 (slots repeat only at the pad slot, which nothing reads)
        self.k.view(-1, *self.k.shape[2:]).index_copy_(0, slots, k.to(self.k.dtype))
        self.v.view(-1, *self.v.shape[2:]).index_copy_(0, slots, v.to(self.v.dtype))
