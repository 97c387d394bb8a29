"""The sharded modules. Each is a subclass of the module it replaces, with the same parameter
names, so a sharded model keeps its state-dict names (shard.shard_model swaps the class of a
built module in place: no parameter is copied).

- RowParallelLinear: the weight's input columns are this rank's (o_proj, out_proj, down_proj);
  the partial products are summed by one all-reduce, then the (replicated) bias is added once.
- VocabParallelEmbedding: this rank's rows of the vocabulary; ids outside them give zeros, and an
  all-reduce adds the one rank's row (exact: the other terms are zeros).
- VocabParallelLMHead: this rank's vocabulary rows of lm_head (or a DeepSeek-style MTP head);
  the logits of every rank are gathered, so sampling and verification see the whole vocabulary.
- TPSparseMoE: the routed experts split across ranks (this rank runs experts [first_expert,
  first_expert + len(experts)) on the tokens routed to them), the shared expert column / row
  sharded; the router and the shared expert's gate are replicated; one all-reduce sums both.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtpx.models.mlp import SparseMoE
from mtpx.parallel.group import TPGroup, all_gather_last, all_reduce


class RowParallelLinear(nn.Linear):
    """x [..., in / world] (this rank's input features) -> [..., out], summed over the ranks."""

    tp: TPGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """ids [...] int64 (full vocabulary) -> [..., hidden]; weight: rows [vocab_start,
    vocab_start + num_embeddings) of the full table."""

    tp: TPGroup
    vocab_start: int

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill(outside[..., None], 0.0), self.tp)


class VocabParallelLMHead(nn.Linear):
    """x [..., hidden] -> logits [..., vocab] (this rank's out_features = vocab / world columns,
    gathered in rank order)."""

    tp: TPGroup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(F.linear(x, self.weight, self.bias), self.tp)


class TPSparseMoE(SparseMoE):
    """SparseMoE with this rank's experts (experts[i] is expert first_expert + i) and a column /
    row sharded shared expert whose down_proj is not reduced on its own: forward's one
    all-reduce sums the routed experts of every rank and the shared expert's partial products."""

    tp: TPGroup
    first_expert: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(super().forward(x), self.tp)

    @torch.compiler.disable
    def _routed(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            token_idx, slot = torch.where(experts == self.first_expert + i)
            if token_idx.numel():
                out.index_add_(0, token_idx, expert(x[token_idx]) * weights[token_idx, slot, None])
        return out
