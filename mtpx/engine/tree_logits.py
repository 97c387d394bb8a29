"""Logits processing over a tree of drafts (tree verification, mtpx/engine/tree_step.py): each node's
column is processed as if its own path were committed, so that min_tokens and the repetition,
frequency and presence penalties stay exact on trees (mtpx/engine/logits.py processes a chain's
column j as if drafts d_1 .. d_j were committed; on a tree the tokens before a node are its
ancestors', not the nodes listed before it)."""
from __future__ import annotations

import dataclasses

import torch

from mtpx.engine.logits import apply_penalties, process_logits
from mtpx.spec_decode.tree import ancestor_mask


class _WithoutPathRules:
    """A request seen without min_tokens and penalties (process_logits applies the rest)."""

    def __init__(self, r):
        self._r = r
        self.params = dataclasses.replace(r.params, min_tokens=0, repetition_penalty=1.0,
                                          frequency_penalty=0.0, presence_penalty=0.0)

    def __getattr__(self, name):
        return getattr(self._r, name)


def process_tree_logits(reqs, logits: torch.Tensor, ids: torch.Tensor, parents: torch.Tensor,
                        depths: torch.Tensor, depth: int) -> torch.Tensor:
    """logits [B, T, V] after tree nodes ids [B, T] (node 0 the root x_n), parents, depths [B, T]
    int64 (mtpx.spec_decode.tree), depth: the deepest node -> the processed logits. Node t's
    column is output token len(output) + depths[t]: min_tokens sets the stop ids to -inf where
    depths[t] < min_tokens - len(output); the penalties count the output tokens plus the tokens of
    t's path below the root (t included). logit_bias and the rest as process_logits
    (allowed_token_ids, bad words and grammars are refused on trees: tree_step.unsupported)."""
    special = [b for b, r in enumerate(reqs) if r.params.min_tokens or r.params.has_penalties]
    if not special:
        return process_logits(reqs, logits)
    out = process_logits([_WithoutPathRules(r) if b in special else r for b, r in enumerate(reqs)], logits)
    out = (out if out is not logits else logits if logits.dtype in (torch.float32, torch.float64)
           else logits.float()).clone()
    V, dev, dtype = out.shape[-1], out.device, out.dtype
    ancestors = ancestor_mask(parents, depth)                    # [B, T, T]: s is t or t's ancestor
    for b in special:
        r = reqs[b]
        left = r.params.min_tokens - len(r.output_token_ids)
        if left > 0 and r.stop_ids:
            stop = torch.tensor([i for i in sorted(r.stop_ids) if i < V], dtype=torch.long, device=dev)
            rows = (depths[b] < left).nonzero()[:, 0]
            out[b, rows[:, None], stop[None]] = float("-inf")
        if r.params.has_penalties:
            counts = torch.bincount(torch.tensor(r.output_token_ids, dtype=torch.long, device=dev),
                                    minlength=V).to(dtype)[None]                           # [1, V]
            path = ancestors[b, :, 1:].to(dtype) @ torch.nn.functional.one_hot(ids[b, 1:], V).to(dtype)
            out[b] = apply_penalties(out[b], r, counts + path)
    return out
