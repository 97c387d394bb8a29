"""All inference state of one engine: per-layer caches of the target and of every MTP module, the
token buffer, and the batch-slot (row) allocator.

This is the contiguous allocator: each running request owns one row of max_len positions.
"""
from __future__ import annotations

import torch

from mtpx.cache.state import KVCache, RecurrentState
from mtpx.models.model import MTPForCausalLM


class ModelCache:
    """rows: max concurrent requests; max_len: positions per row (prompt + output + drafts).

    target: one cache per target layer (KVCache or RecurrentState); draft: one KVCache per MTP module.
    tokens: [rows, max_len] int64: a request's known tokens at [0, num_tokens); the slots after
    them are scratch where the speculator writes its drafts.
    """

    def __init__(self, model: MTPForCausalLM, rows: int, max_len: int, num_draft_modules: int):
        cfg = model.cfg
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        self.rows, self.max_len = rows, max_len
        self.target = []
        for layer in model.model.layers:
            if layer.layer_type == "full_attention":
                self.target.append(KVCache.allocate(rows, max_len, cfg.num_key_value_heads,
                                                    cfg.head_dim, dtype, device))
            else:
                la = layer.linear_attn
                self.target.append(RecurrentState.allocate(rows, la.conv_dim, la.kernel, la.nv,
                                                           la.dk, la.dv, dtype, device))
        self.draft = [KVCache.allocate(rows, max_len, cfg.num_key_value_heads, cfg.head_dim,
                                       dtype, device) for _ in range(num_draft_modules)]
        self.tokens = torch.zeros(rows, max_len, dtype=torch.long, device=device)
        self._free = list(range(rows - 1, -1, -1))

    def num_free_rows(self) -> int:
        return len(self._free)

    def allocate_row(self) -> int:
        """Take a free row and clear its recurrent state. Raises RuntimeError when none is free."""
        if not self._free:
            raise RuntimeError("no free cache row: the engine admitted more than max_num_seqs requests")
        row = self._free.pop()
        for c in self.target:
            if isinstance(c, RecurrentState):
                c.reset(row)
        return row

    def free_row(self, row: int) -> None:
        self._free.append(row)

    def commit_recurrent(self, index: torch.Tensor) -> None:
        """After a keep_states verification forward: keep the state after token index[b]."""
        for c in self.target:
            if isinstance(c, RecurrentState):
                c.commit(index)
