"""Leaf trees ("chain + leaves") drafted by the chain speculator's own round.

A leaf tree (TreeShape.is_leaf_tree) is the chain of first choices to the tree's depth D plus
sibling leaves hanging off it: every node of rank > 0 has no children, e.g.
[[0], [1], [0, 0], [0, 1], [0, 0, 0]]. Its drafting is exactly the chain's: single-module MTP
applies its module D times along the chain, multi-module MTP runs module d once at the chain's
depth d; a leaf of rank r at depth d is the (r + 1)-th best token of the same draft logits
whose best token is the chain's draft at depth d. So the chain speculator (k = D) runs the round,
with argmax drafts (the chain's tokens, identical to a chain of D drafts), and `_LeafPicker`
takes the leaves from the logits it already computes; the round is the chain's draft graph when
compiled (mtpx/engine/compiled_tree.py, LeafDraft).

After verification the accepted path is the chain's first c drafts, then possibly a leaf at depth
c + 1, then the bonus token: for the modules that is the chain round that accepted c drafts
(`settle`): module k's KV at positions that read x_{n+c+1} or later is stale and re-prefilled, as
MultiModuleMTPSpeculator.hold marks it (docs/architecture.md, invariant 2). Single-module MTP
recomputes every position from x_n on in its next round anyway.
"""
from __future__ import annotations

import dataclasses

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.spec_decode.multi_module import MultiModuleMTPSpeculator
from mtpx.spec_decode.protocol import DraftBatch, DraftPlan, Drafts
from mtpx.spec_decode.single_module import SingleModuleMTPSpeculator
from mtpx.spec_decode.tree import TreeShape
from mtpx.spec_decode.tree_draft import TreeSpeculator


use_leaves = True      # False: leaf trees are drafted by the generic tree round (experiments/trees)


class _LeafPicker:
    """A DraftBatch.sampler for the chain round: the argmax draft at depth i (0-based), and in
    `leaves[i]` [B, widths[i] - 1] int64 the next best tokens of the same logits (argmax masked
    out, so no leaf repeats the chain's token)."""

    def __init__(self, widths: list[int]):
        self.widths, self.leaves = widths, {}

    def __call__(self, logits: torch.Tensor, i: int) -> torch.Tensor:
        d = logits.argmax(-1)
        if i < len(self.widths) and self.widths[i] > 1:
            rest = logits.scatter(-1, d[:, None], float("-inf"))
            self.leaves[i] = rest.topk(self.widths[i] - 1, dim=-1).indices
        return d


class LeafTreeSpeculator(TreeSpeculator):
    """TreeSpeculator for a leaf tree (module doc) whose round is the chain speculator's of
    k = shape.depth (base: a chain speculator of k >= shape.depth to share, which allocates and
    owns its state: the engine's, when it chooses chain or tree per step). Drafts.tokens [B, N]
    in the shape's node order, as TreeSpeculator's."""

    leaves = True

    def __init__(self, model, shape: TreeShape, multi: bool, base=None):
        if not shape.is_leaf_tree:
            raise ValueError(f"spec.tree {[list(p) for p in shape.paths]} is not a chain with leaves")
        super().__init__(model, shape, multi)
        D = shape.depth
        if base is None:
            base = MultiModuleMTPSpeculator(model, D) if self.multi else SingleModuleMTPSpeculator(model, D)
        else:                    # the engine's chain speculator (the automatic choice, tree_choice.py)
            self.owns_base, self.multi = False, isinstance(base, MultiModuleMTPSpeculator)
        self.base = base
        self.num_draft_modules = self.base.num_draft_modules
        self.num_lookahead_tokens = self.base.num_lookahead_tokens
        self.chain_widths = shape.widths
        # columns of cat([chain [B, D], leaves of depth 1 [B, w_1 - 1], depth 2, ...]) per node
        first, at = {}, D
        for d, w in enumerate(self.chain_widths):
            first[d], at = at, at + w - 1
        self.columns = torch.tensor([len(p) - 1 if p[-1] == 0 else first[len(p) - 1] + p[-1] - 1
                                     for p in shape.paths])
        self.chain_depth = [max([0] + [len(p) for p in shape.paths[:i]]) for i in range(shape.num_nodes + 1)]

    def allocate(self, cache: ModelCache) -> None:
        super().allocate(cache)
        self.columns = self.columns.to(self.depths.device)

    def _chain_batch(self, batch: DraftBatch, sampler=None) -> DraftBatch:
        """The chain round's batch: node counts (num_drafts, drafts) become the chain drafts they
        need (the depth of the last node: nodes are breadth first), depth at most D."""
        D, nd = self.shape.depth, batch.num_drafts
        if isinstance(nd, int):
            nd = self.chain_depth[min(nd, self.shape.num_nodes)]
        elif nd is not None:
            nd = self.depths.index_select(0, nd.clamp(max=self.shape.num_nodes).reshape(1)).reshape(())
        drafts = None if batch.drafts is None else self.depths[batch.drafts.clamp(0, self.shape.num_nodes)]
        modules = None if batch.num_modules is None else min(batch.num_modules, D)
        return dataclasses.replace(batch, num_drafts=nd, drafts=drafts, depth=batch.depth.clamp(max=D),
                                   num_modules=modules, sampler=sampler)

    def plan(self, cache: ModelCache, batch: DraftBatch) -> DraftPlan:
        return self.base.plan(cache, self._chain_batch(batch))

    def propose(self, cache: ModelCache, batch: DraftBatch, plan: DraftPlan | None = None) -> Drafts:
        """Speculator.propose: the chain round with argmax drafts and the leaves (module doc)."""
        if batch.sampler is not None:
            raise ValueError("spec.tree drafts greedily: sampling (temperature > 0) is not supported yet")
        picker = _LeafPicker(self.chain_widths)
        drafts = self.base.propose(cache, self._chain_batch(batch, picker), plan)
        chain = drafts.tokens                                                   # [B, D]
        parts = [chain] + [picker.leaves.get(d, chain.new_zeros(chain.shape[0], w - 1))
                           for d, w in enumerate(self.chain_widths) if w > 1]
        return Drafts(torch.cat(parts, 1)[:, self.columns], None, drafts.num_final)

    def settle(self, rows: torch.Tensor, n: torch.Tensor, accepted: torch.Tensor, last_node: torch.Tensor,
               depth: torch.Tensor) -> None:
        """TreeSpeculator.settle: the chain accepted c = accepted - (the last node is a leaf, rank
        > 0) drafts, so module k's positions that read x_{n+c+1} .. are stale (module doc)."""
        if self.multi:
            c = accepted - (self.ranks[last_node] > 0).long()
            self.base.hold(rows, depth.clamp(max=self.shape.depth), n + c + 2)


def leaf_tree_speculator(model, shape: TreeShape, multi: bool) -> TreeSpeculator:
    """The speculator of a static tree shape: a LeafTreeSpeculator for a leaf tree (while
    `use_leaves`), else the generic TreeSpeculator."""
    if use_leaves and shape.is_leaf_tree:
        return LeafTreeSpeculator(model, shape, multi)
    return TreeSpeculator(model, shape, multi)
