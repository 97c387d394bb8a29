"""Tree drafting over MTP modules (`spec.tree`): a Speculator whose round proposes a tree of
draft tokens (mtpx/spec_decode/tree.py) instead of a chain.

Every module first catches up over the verified tokens exactly as a chain round that accepted them
would (its re-prefill of stale module KV included), so only the accepted path's module KV survives a
round (docs/architecture.md, invariant 2). The tree grows depth after depth: the nodes a level
expands run through the module, each node's module KV written at a scratch slot (position n + its
offset, past every committed position) with tree attention over its ancestors'
(mtpx.attention.tree_attention); the next round overwrites the scratch.

Known tokens x_0 .. x_n. M(c) names the module output a node's children are drawn from:

- single-module MTP (`mtp1`): M(root) = a_{n-1}, the module's output at n - 1 (reading x_n,
  h_{n-1}), from the catch-up; a node c at depth s runs the module at position n - 1 + s on (its
  token, M(parent)). Children of c: the top-k of the module's logits at M(c).
- multi-module MTP (`mtp8`): module L at position j reads x_{j+L} and a^{L-1}_j, so the children at
  depth L of a node c at depth L - 1 come from M_L(c) = module L at position n - L + depth(c) on
  (c's token, M_{L-1}(parent)), after module L ran over c's ancestors too (its own attention
  context, as a chain round re-prefills). Module L runs ONCE per round, over its catch-up positions
  and the expanded nodes of depths 1 .. L - 1 together (`_fold`), as the chain runs each module
  once over its re-prefill and its drafts; M_L(root) = a^L_{n-L} is the catch-up's last output.

Static shapes (TreeShape) expand every node above the last depth; a node's offset is its index.
Dynamic trees (DynamicTree, EAGLE-2): each level keeps the topk candidates of highest cumulative
draft log-probability as its frontier (offsets (level - 1) * topk + 1 ..), and the round returns
the num_draft_tokens best candidates, breadth first, as each row's own tree (`rows_tree`).

Returned drafts are the N node tokens breadth first (Drafts.tokens [B, N]). Greedy drafting only
(the draft's top-k).
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from mtpx.attention import tree_kernel
from mtpx.attention.tree_attention import node_meta
from mtpx.cache.model_cache import ModelCache, put_rows
from mtpx.spec_decode.common import gather_hidden, last_valid, run_module
from mtpx.spec_decode.multi_module import MultiModuleMTPSpeculator, module_bounds
from mtpx.spec_decode.protocol import DraftBatch, DraftPlan, Drafts
from mtpx.spec_decode.single_module import SingleModuleMTPSpeculator
from mtpx.spec_decode.tree import DynamicTree, TreeShape, ancestor_mask
from mtpx.spec_decode import tree_dynamic


use_fold = True            # False: module L over its catch-up, then over the nodes (experiments/trees)


class TreeSpeculator:
    """Speculator (mtpx/spec_decode/protocol.py) proposing shape.num_nodes drafts as a tree
    (module doc). multi: multi-module MTP (module d drafts depth d), else single-module MTP."""

    leaves = False       # a leaf tree drafted by the chain's round (mtpx/spec_decode/tree_leaves.py)
    owns_base = True     # False: `base` is the engine's chain speculator, allocated by it (tree_leaves.py)

    def __init__(self, model, shape: TreeShape | DynamicTree, multi: bool):
        self.model, self.shape = model, shape
        self.dynamic = isinstance(shape, DynamicTree)
        self.multi = multi and shape.depth >= 2           # a depth-1 tree is module 1 alone either way
        self.base = (MultiModuleMTPSpeculator(model, shape.depth) if self.multi
                     else SingleModuleMTPSpeculator(model, 1))
        self.num_speculative_tokens = shape.num_nodes
        self.num_draft_modules = self.base.num_draft_modules
        self.num_lookahead_tokens = self.base.num_lookahead_tokens
        if self.dynamic:                   # offsets: the root, then each level's frontier (tree_dynamic)
            self.offset_depths = [0] + [d for d in range(1, shape.depth) for _ in range(shape.topk)]
            N = shape.num_nodes
            self.parents, self.depths = torch.arange(-1, N), torch.arange(N + 1)   # until a row drafts
            self.ranks = self.ancestors = torch.zeros(N + 1, dtype=torch.long)
        else:
            self.offset_depths = shape.depths
            self.parents, self.depths, self.ranks = shape.tensors()
            self.ancestors = ancestor_mask(self.parents[None], shape.depth)[0]          # [N + 1, N + 1]
            self.ancestors[:, 0] = False       # the root's module KV is committed, not at its scratch slot

    def allocate(self, cache: ModelCache) -> None:
        if self.owns_base:
            self.base.allocate(cache)
        self.buffers = self.base.buffers
        dev = self.base.buffers[0].device
        self.parents, self.depths, self.ranks, self.ancestors = (
            x.to(dev) for x in (self.parents, self.depths, self.ranks, self.ancestors))
        if self.dynamic:              # each row's last tree [rows, N + 1] (the pad row included)
            self.row_trees = [x[None].repeat(cache.rows + 1, 1)
                              for x in (self.parents, self.depths, self.ranks)]

    def rows_tree(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The trees the rows' last drafts form: (parents, depths, ranks) [B, N + 1] int64, node 0
        the root (parent -1); a static shape's for every row."""
        if self.dynamic:
            return tuple(x[rows] for x in self.row_trees)
        return tuple(x.expand(rows.shape[0], -1) for x in (self.parents, self.depths, self.ranks))

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0) -> None:
        self.base.reset_rows(rows, start)

    def hold(self, rows: torch.Tensor, depth: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
        """Speculator.hold: the chain speculator's (tree steps always run a round; the contract's)."""
        return self.base.hold(rows, depth.clamp(max=self.base.num_speculative_tokens), num_tokens)

    def settle(self, rows: torch.Tensor, n: torch.Tensor, accepted: torch.Tensor, last_node: torch.Tensor,
               depth: torch.Tensor) -> None:
        """After a tree verification (n [B]: x_n's position; accepted [B]: the accepted path's
        length; last_node [B]: its last node; depth [B]: DraftBatch.depth): nothing here, the next
        round re-prefills the accepted path (LeafTreeSpeculator marks its chain's stale KV)."""

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
        """Speculator.propose: the catch-up and the tree of each drafting row (module doc)."""
        if batch.sampler is not None:
            raise ValueError("spec.tree drafts greedily: sampling (temperature > 0) is not supported yet")
        b = self._catch_up(batch)
        n = b.num_tokens - 1
        tokens = torch.zeros(b.rows.shape[0], self.shape.num_nodes, dtype=torch.long, device=n.device)
        if self.multi:
            idx = b.is_drafting.nonzero()[:, 0]
            g = _rows(self._grow_multi(cache, b, n), idx)
            num_final = self.base._num_final(b.rows, b.depth, b.num_tokens)
        else:
            root, num_final = self._single_catch_up(cache, b)
            idx = b.is_drafting.nonzero()[:, 0]
            if not idx.numel():
                return Drafts(tokens, None, num_final)
            g = self._grow(cache, b.rows[idx], n[idx], root[idx])
        if not idx.numel():
            return Drafts(tokens, None, num_final)
        if self.dynamic:
            tok, *tree = tree_dynamic.select(g, self.shape)
            for buf, x in zip(self.row_trees, tree):
                buf[b.rows[idx]] = x
            tokens[idx] = tok
        else:
            tokens[idx] = g.tok[:, 1:]
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

    def _round(self, B: int, device) -> SimpleNamespace:
        """A round's expanded nodes: tok, par (parent offset), anc (ancestors) [B, E + 1, ...]
        (tree_dynamic.new_round's; a static shape's nodes are its offsets)."""
        if self.dynamic:
            return tree_dynamic.new_round(self.shape, B, device)
        N = self.shape.num_nodes
        return SimpleNamespace(tok=torch.zeros(B, N + 1, dtype=torch.long, device=device),
                               par=self.parents.expand(B, -1), anc=self.ancestors.expand(B, -1, -1))

    def _nodes(self, lo: int, hi: int) -> list[int]:
        """The offsets of the expanded nodes of depths lo .. hi."""
        return [i for i, d in enumerate(self.offset_depths) if lo <= d <= hi]

    def _grow(self, cache: ModelCache, rows: torch.Tensor, n: torch.Tensor, root: torch.Tensor):
        """Single-module MTP: the round of drafting rows (root: a_{n-1} [B, hidden]) -> its state."""
        g = self._round(rows.shape[0], n.device)
        M = None                      # [B, E + 1, hidden]: M of the nodes computed
        for level in range(1, self.shape.depth + 1):
            if level == 1:
                a = root[:, None]                                                  # [B, 1, hidden]
            else:
                nodes = self._nodes(level - 1, level - 1)
                M = self._module(cache, rows, n, g, M, root, 1, nodes)
                a = M[:, nodes]
            self._children(g, level, a)
        return g

    def _children(self, g: SimpleNamespace, level: int, a: torch.Tensor) -> None:
        """The depth-`level` children from the draft logits at a [B, P, hidden], the M of the nodes
        `level` expands (`_nodes(level - 1, level - 1)`): a static shape's top-k into g.tok, or
        tree_dynamic.expand."""
        shape = self.shape
        logits = self.model.draft_logits(level - 1 if self.multi else 0, a)        # [B, P, V]
        if self.dynamic:
            tree_dynamic.expand(g, shape, level, logits)
            return
        par = self._nodes(level - 1, level - 1)
        top = logits.topk(shape.widths[level - 1], dim=-1).indices
        children = [i for i, d in enumerate(shape.depths) if d == level]
        at = {p: j for j, p in enumerate(par)}
        pj = torch.tensor([at[shape.parents[c]] for c in children], device=g.tok.device)
        rk = torch.tensor([shape.ranks[c] for c in children], device=g.tok.device)
        g.tok[:, children] = top[:, pj, rk]

    def _grow_multi(self, cache: ModelCache, b: DraftBatch, n: torch.Tensor) -> SimpleNamespace:
        """Multi-module MTP's round: module L runs once, over its catch-up positions (the chain
        speculator's `bounds`: the stale and the newly verified ones, start_L .. n - L) and the
        expanded nodes of depths 1 .. L - 1, in one forward (`_fold`) when every row drafts and
        fits the tree kernel's window, else in two (the catch-up, then `_module`). Writes the
        module window and progress as the chain round without drafts -> the round's state."""
        base, rows = self.base, b.rows
        g = self._round(rows.shape[0], n.device)
        prev, prev_start, prev_len = b.target_hidden, b.target_start[:, None], None
        M, done, idle = None, [], False
        for L, (start, end) in enumerate(module_bounds(base, b), start=1):
            idle = idle or not bool((end > start).any())         # MultiModuleMTPSpeculator.plan's break
            length = torch.zeros_like(start) if idle else end - start
            meta = cache.meta(start, length, rows)
            hidden = gather_hidden(meta, prev, prev_start, base.window, L - 1)
            nodes = self._nodes(1, L - 1)
            if not nodes:
                a = run_module(self.model, cache, L, meta, hidden) if meta.valid.shape[1] else hidden
            else:
                root = self._output_at(prev, prev_start[:, 0], prev_len, rows, L - 1, n - L + 1)
                fold = (use_fold and bool(b.is_drafting.all()) and bool((end == n - L + 1).all())
                        and meta.valid.shape[1] + len(nodes) <= tree_kernel.MAX_WINDOW)
                a, M = (self._fold(cache, b, n, L, meta, length, hidden, g, M, root, nodes) if fold
                        else self._split(cache, b, n, L, meta, hidden, g, M, root, nodes))
            if not idle:
                done.append((L, meta, a, end))
            if L == 1:
                self._children(g, 1, self._output_at(a, start, length, rows, 1, n - 1)[:, None])
            else:
                self._children(g, L, M[:, self._nodes(L - 1, L - 1)])
            prev, prev_start, prev_len = a, start[:, None], length      # (a row without columns: the window)
        for L, meta, a, end in done:
            if L < base.num_speculative_tokens:                  # after every module read the window
                base.window.write(L, meta, a)
            put_rows(base.computed, rows, torch.full_like(rows, L - 1), end)
        return g

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

    def _split(self, cache, b, n, L, meta, hidden, g, M, root, nodes):
        """Module L over the catch-up, then over the nodes of drafting rows (`_module`) -> (the
        catch-up's output [B, T, hidden], M_L [B, E + 1, hidden])."""
        a = run_module(self.model, cache, L, meta, hidden) if meta.valid.shape[1] else hidden
        out = torch.zeros(*g.tok.shape, root.shape[-1], dtype=root.dtype, device=root.device)
        idx = b.is_drafting.nonzero()[:, 0]
        if idx.numel():
            out[idx] = self._module(cache, b.rows[idx], n[idx], _rows(g, idx),
                                    None if M is None else M[idx], root[idx], L, nodes)
        return a, out

    def _node_inputs(self, g, M, root, idx):
        """Expanded nodes idx's (token, hidden input: M of the parent, root [B, hidden] for the
        root's children) -> ([B, P], [B, P, hidden])."""
        par = g.par[:, idx]
        hidden = root[:, None].expand(-1, idx.shape[0], -1)
        if M is not None:
            up = M.gather(1, par.clamp(min=0)[..., None].expand(-1, -1, M.shape[-1]))
            hidden = torch.where((par == 0)[..., None], hidden, up)
        return g.tok[:, idx], hidden

    def _fold(self, cache, b, n, L, meta, length, hidden, g, M, root, nodes):
        """Module L in one forward over [catch-up positions, nodes of depths 1 .. L - 1] (every
        row drafts; its catch-up ends at n - L + 1). The catch-up's C columns (ragged, left
        aligned) sit causally at their committed slots; node i at its scratch slot n + i, RoPE
        position n - L + depth(i), sees the committed KV, the whole catch-up and its ancestors
        (positions n - L + 1 .. n - 1, stale chain KV, are masked). Tree attention with base
        n - L + 1 - C: key j of the window is position base + j, S = C + L + E keys.
        -> (the catch-up's output [B, C, hidden], M_L [B, E + 1, hidden])."""
        rows, B, C, E = b.rows, b.rows.shape[0], meta.valid.shape[1], g.tok.shape[1] - 1
        dev, K = n.device, len(nodes)
        idx = torch.tensor(nodes, device=dev)
        node_tok, node_hidden = self._node_inputs(g, M, root, idx)
        lo = (C - length)[:, None, None]                                           # first catch-up key
        s = torch.arange(C + L + E, device=dev)[None, None]
        t = torch.arange(C, device=dev)[None, :, None]
        trunk = (s >= lo) & (s <= lo + t) & (t < length[:, None, None])           # [B, C, S]
        tree = torch.zeros(B, K, C + L + E, dtype=torch.bool, device=dev)
        tree[:, :, C + L - 1:] = g.anc[:, idx]
        tree |= (s >= lo) & (s < C)
        lo = lo[:, :, 0]
        slots = torch.cat([torch.where(meta.valid, lo + torch.arange(C, device=dev)[None], lo),
                           C + L - 1 + idx[None].expand(B, K)], 1)              # key index: position - base
        valid = torch.cat([meta.valid, torch.ones(B, K, dtype=torch.bool, device=dev)], 1)
        fmeta = node_meta(cache.block_tables[rows], cache.block_size, rows, n - L + 1 - C, slots, valid,
                          n - L + 1 - length, torch.cat([trunk, tree], 1), cache.gdn_backend)
        ids = torch.cat([cache.tokens[rows[:, None], meta.positions + L], node_tok], 1)
        depth = torch.tensor(self.offset_depths, device=dev)[idx]
        rope = torch.cat([meta.positions, n[:, None] - L + depth[None]], 1)
        a = self.model.mtp[L - 1](self.model.model.embed_tokens(ids), torch.cat([hidden, node_hidden], 1),
                                  rope, cache.draft[L - 1], fmeta)
        out = torch.zeros(B, E + 1, a.shape[-1], dtype=a.dtype, device=dev)
        out[:, idx] = a[:, C:]
        return a[:, :C], out

    def _module(self, cache: ModelCache, rows, n, g, M, root, level: int, nodes: list[int]):
        """Run the module of `level` over the expanded `nodes` at their positions, each on (its
        token, its parent's M; root [B, hidden] for the root's children), KV at scratch slots
        n + offset, tree attention over its ancestors -> M [B, E + 1, hidden] with those nodes'
        outputs set (single-module MTP: the earlier ones kept)."""
        B = rows.shape[0]
        module = level if self.multi else 1
        idx = torch.tensor(nodes, device=n.device)
        tok, hidden = self._node_inputs(g, M, root, idx)
        depth = torch.tensor(self.offset_depths, device=n.device)[idx]
        rope = n[:, None] - module + depth[None]
        meta = node_meta(cache.block_tables[rows], cache.block_size, rows, n, idx[None].expand(B, -1),
                         torch.ones(B, len(nodes), dtype=torch.bool, device=n.device),
                         n - module + 1, g.anc[:, idx], cache.gdn_backend)
        emb = self.model.model.embed_tokens(tok)
        a = self.model.mtp[module - 1](emb, hidden, rope, cache.draft[module - 1], meta)
        out = (torch.zeros(*g.tok.shape, a.shape[-1], dtype=a.dtype, device=a.device)
               if M is None or self.multi else M.clone())
        out[:, idx] = a
        return out


def _rows(g: SimpleNamespace, idx: torch.Tensor) -> SimpleNamespace:
    """A round's state for the rows idx [B'] int64."""
    out = SimpleNamespace(**{k: v[idx] for k, v in vars(g).items() if torch.is_tensor(v)})
    if hasattr(g, "cands"):
        out.cands = [(c[0][idx], c[1][idx], c[2], c[3]) for c in g.cands]
    return out
