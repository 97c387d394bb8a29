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

from mtpx.attention import tree_kernel
from mtpx.attention.tree_attention import node_meta
from mtpx.cache.model_cache import ModelCache, put_rows
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
        tokens = torch.zeros(b.rows.shape[0], self.shape.num_nodes, dtype=torch.long, device=n.device)
        if self.multi:
            tok = self._grow_multi(cache, b, n)
            tokens = torch.where(b.is_drafting[:, None], tok[:, 1:], 0)
            return Drafts(tokens, None, self.base._num_final(b.rows, b.depth, b.num_tokens))
        root, num_final = self._single_catch_up(cache, b)
        idx = b.is_drafting.nonzero()[:, 0]
        if idx.numel():
            tokens[idx] = self._grow(cache, b.rows[idx], n[idx], root[idx])
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

    def _grow(self, cache: ModelCache, rows: torch.Tensor, n: torch.Tensor, root: torch.Tensor):
        """Single-module MTP: the tree's tokens [B, N] for drafting rows (root: a_{n-1} [B, hidden])."""
        shape = self.shape
        tok = torch.zeros(rows.shape[0], shape.num_nodes + 1, dtype=torch.long, device=n.device)
        M = None                      # [B, N + 1, hidden]: M of the nodes computed
        for level in range(1, shape.depth + 1):
            if level == 1:
                a = root[:, None]                                                  # [B, 1, hidden]
            else:
                nodes = [i for i, d in enumerate(shape.depths) if d == level - 1]
                M = self._module(cache, rows, n, tok, M, root, level, nodes)
                a = M[:, nodes]
            self._children(tok, level, a)
        return tok[:, 1:]

    def _children(self, tok: torch.Tensor, level: int, a: torch.Tensor) -> None:
        """tok[:, depth-`level` nodes] = the top-k of the draft logits at a [B, P, hidden] (M of the
        depth level - 1 nodes, in node order)."""
        shape = self.shape
        par = [i for i, d in enumerate(shape.depths) if d == level - 1]
        logits = self.model.draft_logits(level - 1 if self.multi else 0, a)        # [B, P, V]
        top = logits.topk(shape.widths[level - 1], dim=-1).indices
        children = [i for i, d in enumerate(shape.depths) if d == level]
        at = {p: j for j, p in enumerate(par)}
        pj = torch.tensor([at[shape.parents[c]] for c in children], device=tok.device)
        rk = torch.tensor([shape.ranks[c] for c in children], device=tok.device)
        tok[:, children] = top[:, pj, rk]

    def _grow_multi(self, cache: ModelCache, b: DraftBatch, n: torch.Tensor) -> torch.Tensor:
        """Multi-module MTP's round: module L runs once, over its catch-up positions (the chain
        speculator's `bounds`: the stale and the newly verified ones, start_L .. n - L) and the
        tree's nodes of depths 1 .. L - 1, in one forward (`_fold`) when every row drafts and
        fits the tree kernel's window, else in two (the catch-up, then `_module`). Writes the
        module window and progress as the chain round without drafts -> tokens [B, N + 1]
        (column 0, the root, unused)."""
        base, shape, rows = self.base, self.shape, b.rows
        tok = torch.zeros(rows.shape[0], shape.num_nodes + 1, dtype=torch.long, device=n.device)
        prev, prev_start, prev_len = b.target_hidden, b.target_start[:, None], None
        M, done, idle = None, [], False
        for L, (start, end) in enumerate(base.bounds(b), start=1):
            idle = idle or not bool((end > start).any())         # MultiModuleMTPSpeculator.plan's break
            length = torch.zeros_like(start) if idle else end - start
            meta = cache.meta(start, length, rows)
            hidden = gather_hidden(meta, prev, prev_start, base.window, L - 1)
            nodes = [i for i, d in enumerate(shape.depths) if 1 <= d <= L - 1]
            if not nodes:
                a = run_module(self.model, cache, L, meta, hidden) if meta.valid.shape[1] else hidden
            else:
                root = self._output_at(prev, prev_start[:, 0], prev_len, rows, L - 1, n - L + 1)
                fold = (bool(b.is_drafting.all()) and bool((end == n - L + 1).all())
                        and meta.valid.shape[1] + len(nodes) <= tree_kernel.MAX_WINDOW)
                a, M = (self._fold(cache, b, n, L, meta, length, hidden, tok, M, root, nodes) if fold
                        else self._split(cache, b, n, L, meta, hidden, tok, M, root, nodes))
            if not idle:
                done.append((L, meta, a, end))
            if L == 1:
                a1 = self._output_at(a, start, length, rows, 1, n - 1)[:, None]
                self._children(tok, 1, a1)
            else:
                self._children(tok, L, M[:, [i for i, d in enumerate(shape.depths) if d == L - 1]])
            prev, prev_start, prev_len = a, meta.positions[:, :1], length
        for L, meta, a, end in done:
            if L < base.num_speculative_tokens:                  # after every module read the window
                base.window.write(L, meta, a)
            put_rows(base.computed, rows, torch.full_like(rows, L - 1), end)
        return tok

    def _output_at(self, out, start, length, rows, level: int, pos: torch.Tensor) -> torch.Tensor:
        """Module `level`'s output at position pos [B]: from this round's `out` [B, T, hidden] (its
        positions start .. start + length - 1) where it covers pos, else from the window."""
        w = self.base.window
        old = w.buf[level - 1][rows, pos % w.window]
        if length is None or out.shape[1] == 0:
            return old
        idx = pos - start
        cur = out[torch.arange(out.shape[0], device=out.device), idx.clamp(0, out.shape[1] - 1)]
        return torch.where(((idx >= 0) & (idx < length))[:, None], cur, old)

    def _split(self, cache, b, n, L, meta, hidden, tok, M, root, nodes):
        """Module L over the catch-up, then over the nodes of drafting rows (`_module`) -> (the
        catch-up's output [B, T, hidden], M_L [B, N + 1, hidden])."""
        a = run_module(self.model, cache, L, meta, hidden) if meta.valid.shape[1] else hidden
        out = torch.zeros(tok.shape[0], tok.shape[1], root.shape[-1], dtype=root.dtype, device=root.device)
        idx = b.is_drafting.nonzero()[:, 0]
        if idx.numel():
            out[idx] = self._module(cache, b.rows[idx], n[idx], tok[idx], M[idx] if M is not None else None,
                                    root[idx], L, nodes)
        return a, out

    def _fold(self, cache, b, n, L, meta, length, hidden, tok, M, root, nodes):
        """Module L in one forward over [catch-up positions, nodes of depths 1 .. L - 1] (every
        row drafts; its catch-up ends at n - L + 1). The catch-up's C columns (ragged, left
        aligned) sit causally at their committed slots; node i at its scratch slot n + i, RoPE
        position n - L + depth(i), sees the committed KV, the whole catch-up and its ancestors
        (positions n - L + 1 .. n - 1, stale chain KV, are masked). Tree attention with base
        n - L + 1 - C: key j of the window is position base + j, S = C + L + N keys.
        -> (the catch-up's output [B, C, hidden], M_L [B, N + 1, hidden])."""
        rows, B, C, N = b.rows, b.rows.shape[0], meta.valid.shape[1], self.shape.num_nodes
        dev, K = n.device, len(nodes)
        idx = torch.tensor(nodes, device=dev)
        par = self.parents[idx]
        node_hidden = torch.where((par == 0)[None, :, None], root[:, None], M[:, par.clamp(min=0)]
                                  if M is not None else root[:, None])
        base = n - L + 1 - C
        lo = (C - length)[:, None, None]                                           # first catch-up key
        s = torch.arange(C + L + N, device=dev)[None, None]
        t = torch.arange(C, device=dev)[None, :, None]
        trunk = (s >= lo) & (s <= lo + t) & (t < length[:, None, None])           # [B, C, S]
        tree = torch.zeros(B, K, C + L + N, dtype=torch.bool, device=dev)
        tree[:, :, C + L - 1:] = self.ancestors[idx]
        tree |= (s >= lo) & (s < C)
        lo = lo[:, :, 0]
        slots = torch.cat([torch.where(meta.valid, lo + torch.arange(C, device=dev)[None], lo),
                           C + L - 1 + idx[None].expand(B, K)], 1)              # key index: position - base
        valid = torch.cat([meta.valid, torch.ones(B, K, dtype=torch.bool, device=dev)], 1)
        fmeta = node_meta(cache.block_tables[rows], cache.block_size, rows, base, slots, valid,
                          n - L + 1 - length, torch.cat([trunk, tree], 1), cache.gdn_backend)
        ids = torch.cat([cache.tokens[rows[:, None], meta.positions + L], tok[:, idx]], 1)
        rope = torch.cat([meta.positions, n[:, None] - L + self.depths[idx][None]], 1)
        a = self.model.mtp[L - 1](self.model.model.embed_tokens(ids), torch.cat([hidden, node_hidden], 1),
                                  rope, cache.draft[L - 1], fmeta)
        out = torch.zeros(B, N + 1, a.shape[-1], dtype=a.dtype, device=dev)
        out[:, idx] = a[:, C:]
        return a[:, :C], out

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
