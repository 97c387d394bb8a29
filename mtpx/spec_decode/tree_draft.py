"""Tree drafting over MTP modules (`spec.tree`): a Speculator whose round proposes a tree of
draft tokens (mtpx/spec_decode/tree.py) instead of a chain.

A round first runs the chain speculator it wraps without drafts: every module catches up over the
verified tokens exactly as a chain round that accepted them would (its re-prefill of stale module
KV included), so only the accepted path's module KV survives a round (docs/architecture.md,
invariant 2). Then the tree grows depth after depth, each node's module KV written at a scratch
slot (position n + node index, past every committed position) with tree attention over its
ancestors' (mtpx.attention.tree_attention); the next round overwrites the scratch.

Known tokens x_0 .. x_n. M(c) names the module output a node's children are drawn from:

- single-module MTP (`mtp1`): M(root) = a_{n-1}, the module's output at n - 1 (reading x_n,
  h_{n-1}); a node c at depth s runs the module at position n - 1 + s on (its token, M(parent)).
  Children of c: the top-k of the module's logits at M(c).
- multi-module MTP (`mtp8`): module L at position j reads x_{j+L} and a^{L-1}_j, so the children at
  depth L of a node c at depth L - 1 come from M_L(c) = module L at position n - L + depth(c) on
  (c's token, M_{L-1}(parent)), after module L ran over c's ancestors too (its own attention
  context, as a chain round re-prefills). M_L(root) = a^L_{n-L}, computed by the catch-up, comes
  from the speculator's window of module outputs.

Returned drafts are the N node tokens breadth first (Drafts.tokens [B, N]); the tree's parents
are the shape's. Greedy drafting only (the draft's top-k).
"""
from __future__ import annotations

import dataclasses

import torch

from mtpx.attention.tree_attention import node_meta
from mtpx.cache.model_cache import ModelCache
from mtpx.spec_decode.common import gather_hidden, last_valid, run_module
from mtpx.spec_decode.multi_module import MultiModuleMTPSpeculator
from mtpx.spec_decode.protocol import DraftBatch, DraftPlan, Drafts
from mtpx.spec_decode.single_module import SingleModuleMTPSpeculator
from mtpx.spec_decode.tree import TreeShape, ancestor_mask


class TreeSpeculator:
    """Speculator (mtpx/spec_decode/protocol.py) proposing shape.num_nodes drafts as a tree
    (module doc). multi: multi-module MTP (module d drafts depth d), else single-module MTP."""

    def __init__(self, model, shape: TreeShape, multi: bool):
        self.model, self.shape = model, shape
        self.multi = multi and shape.depth >= 2           # a depth-1 tree is module 1 alone either way
        self.base = (MultiModuleMTPSpeculator(model, shape.depth) if self.multi
                     else SingleModuleMTPSpeculator(model, 1))
        self.num_speculative_tokens = shape.num_nodes
        self.num_draft_modules = self.base.num_draft_modules
        self.num_lookahead_tokens = self.base.num_lookahead_tokens
        parents, depths, ranks = shape.tensors()
        self.parents, self.depths, self.ranks = parents, depths, ranks
        self.ancestors = ancestor_mask(parents[None], shape.depth)[0]               # [N + 1, N + 1]
        self.ancestors[:, 0] = False           # the root's module KV is committed, not at its scratch slot

    def allocate(self, cache: ModelCache) -> None:
        self.base.allocate(cache)
        self.buffers = self.base.buffers
        dev = self.base.buffers[0].device
        self.parents, self.depths, self.ranks, self.ancestors = (
            x.to(dev) for x in (self.parents, self.depths, self.ranks, self.ancestors))

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0) -> None:
        self.base.reset_rows(rows, start)

    def hold(self, rows: torch.Tensor, depth: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
        """Speculator.hold: the chain speculator's (tree steps always run a round; the contract's)."""
        return self.base.hold(rows, depth.clamp(max=self.base.num_speculative_tokens), num_tokens)

    def _catch_up(self, batch: DraftBatch) -> DraftBatch:
        """The chain round without drafts over the verified tokens (module doc)."""
        k = self.base.num_speculative_tokens
        return dataclasses.replace(batch, num_drafts=0, drafts=torch.zeros_like(batch.depth), sampler=None,
                                   depth=batch.depth.clamp(max=k), num_modules=k, num_columns=None,
                                   block_table=None, catch_up=False)

    def plan(self, cache: ModelCache, batch: DraftBatch) -> DraftPlan:
        """The catch-up's plan (the tree's forwards depend on its drafts)."""
        return self.base.plan(cache, self._catch_up(batch))

    def propose(self, cache: ModelCache, batch: DraftBatch, plan: DraftPlan | None = None) -> Drafts:
        """Speculator.propose: the catch-up, then the tree of each drafting row (module doc)."""
        if batch.sampler is not None:
            raise ValueError("spec.tree drafts greedily: sampling (temperature > 0) is not supported yet")
        b = self._catch_up(batch)
        n = b.num_tokens - 1
        if self.multi:
            num_final = self.base.propose(cache, b).num_final
            root = None
        else:
            root, num_final = self._single_catch_up(cache, b)
        tokens = torch.zeros(b.rows.shape[0], self.shape.num_nodes, dtype=torch.long, device=n.device)
        idx = b.is_drafting.nonzero()[:, 0]
        if idx.numel():
            tokens[idx] = self._grow(cache, b.rows[idx], n[idx], None if root is None else root[idx])
        return Drafts(tokens, None, num_final)

    def _single_catch_up(self, cache: ModelCache, b: DraftBatch):
        """Single-module MTP's step 1 (SingleModuleMTPSpeculator.propose without drafts), keeping
        its output at each row's last position -> (a [B, hidden], num_final [B])."""
        base, n = self.base, b.num_tokens - 1
        plan = base.plan(cache, b)
        a = None
        if plan.metas:
            meta = plan.metas[0]
            hidden = gather_hidden(meta, b.target_hidden, b.target_start[:, None])
            out = run_module(self.model, cache, 1, meta, hidden)
            a = last_valid(out, meta)
            base.computed.index_copy_(0, b.rows, plan.computed[0])
        return a, torch.minimum(base.computed[b.rows], n).clamp(min=0)

    def _grow(self, cache: ModelCache, rows: torch.Tensor, n: torch.Tensor, root: torch.Tensor | None):
        """The tree's tokens [B, N] for drafting rows (root: single-module MTP's a_{n-1} [B, hidden])."""
        shape, B = self.shape, rows.shape[0]
        depths = shape.depths
        tok = torch.zeros(B, shape.num_nodes + 1, dtype=torch.long, device=n.device)
        M = None                      # [B, N + 1, hidden]: M (multi: M_level) of the nodes computed
        for level in range(1, shape.depth + 1):
            par = [i for i, d in enumerate(depths) if d == level - 1]            # expanded at this level
            if level == 1:
                a = self._root_out(root, rows, n, 1)[:, None]                     # [B, 1, hidden]
            else:
                low = 1 if self.multi else level - 1
                nodes = [i for i, d in enumerate(depths) if low <= d <= level - 1]
                hidden = self._root_out(root, rows, n, level - 1)
                M = self._module(cache, rows, n, tok, M, hidden, level, nodes)
                a = M[:, par]
            logits = self.model.draft_logits(level - 1 if self.multi else 0, a)    # [B, P, V]
            top = logits.topk(shape.widths[level - 1], dim=-1).indices
            children = [i for i, d in enumerate(depths) if d == level]
            at = {p: j for j, p in enumerate(par)}
            pj = torch.tensor([at[shape.parents[c]] for c in children], device=n.device)
            rk = torch.tensor([shape.ranks[c] for c in children], device=n.device)
            tok[:, children] = top[:, pj, rk]
        return tok[:, 1:]

    def _root_out(self, root, rows: torch.Tensor, n: torch.Tensor, level: int) -> torch.Tensor:
        """M_level(root) [B, hidden]: single-module MTP's a_{n-1} (root), or module level's output
        at n - level from the multi-module window (the catch-up computed it)."""
        if not self.multi:
            return root
        w = self.base.window
        return w.buf[level - 1][rows, (n - level) % w.window]

    def _module(self, cache: ModelCache, rows, n, tok, M, root_hidden, level: int, nodes: list[int]):
        """Run the module of `level` over `nodes` at their positions, each on (its token, its
        parent's M; root_hidden [B, hidden] for the root's children), KV at scratch slots n + node,
        tree attention over its ancestors -> M [B, N + 1, hidden] with those nodes' outputs set
        (single-module MTP: the earlier ones kept)."""
        B, H = rows.shape[0], root_hidden.shape[-1]
        module = level if self.multi else 1
        idx = torch.tensor(nodes, device=n.device)
        parents, depth = self.parents[idx], self.depths[idx]
        hidden = root_hidden[:, None].expand(B, len(nodes), H)
        if M is not None:
            hidden = torch.where((parents == 0)[None, :, None], hidden, M[:, parents.clamp(min=0)])
        shift = module if self.multi else 1
        rope = n[:, None] - shift + depth[None]
        meta = node_meta(cache.block_tables[rows], cache.block_size, rows, n, idx[None].expand(B, -1),
                         torch.ones(B, len(nodes), dtype=torch.bool, device=n.device),
                         n - shift + 1, self.ancestors[idx][None].expand(B, -1, -1), cache.gdn_backend)
        emb = self.model.model.embed_tokens(tok[:, idx])
        a = self.model.mtp[module - 1](emb, hidden, rope, cache.draft[module - 1], meta)
        out = (torch.zeros(B, self.shape.num_nodes + 1, H, dtype=a.dtype, device=a.device)
               if M is None or self.multi else M.clone())
        out[:, idx] = a
        return out
