"""engine.compile for tree drafting (docs/trees.md): the target's forward over every request's tree
(tree verification, mtpx/models/tree_forward.py) as one compiled function, on the engine's
CompiledDecode (mtpx/engine/compiled.py: its build report, saved graphs and patches).

    tree_verify_forward(model, cache, ids, ...) -> (hidden, logits, each Gated DeltaNet layer's
                                                    (ext, taps, ssm))

Shapes: the window is always the whole tree (1 + N nodes, `static_window`): a request the
scheduler lets verify fewer drafts has padding nodes (valid False, KV written to the pad slot,
no state change), so an engine builds one verification graph, whatever its requests verify; the
batch is dynamic, as the chain's (one graph for every batch size; on the tiny test model
Inductor's guards batch >= 2 somewhere, and batch 1 is a second variant: tests/test_tree_compiled.py).
The attention and Gated DeltaNet tree kernels are the torch ops `mtpx::paged_tree_attention` and
`mtpx::gdn_tree` (mtpx/attention/tree_kernel.py, mtpx/models/gdn_tree_kernel.py), the same C code as eager, so
compiled and eager compute the same values. Saved under the step's precompile folder, in a
subfolder per tree shape (the shape's parents and levels are constants of the graph).

A leaf tree's drafting round (the chain speculator's round plus the leaves,
mtpx/spec_decode/tree_leaves.py) is the chain's draft graph (`LeafDraft`): a leaf-tree engine builds
2 graphs, the automatic choice between chain and tree (mtpx/engine/tree_choice.py) automatic k's
and these 2. Eager, as without compile: other trees' drafting round (the modules over the tree,
mtpx/spec_decode/tree_draft.py), the walk, the KV move and the state commit (mtpx/engine/tree_step.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import torch

from mtpx.attention.meta import ForwardMeta
from mtpx.attention.tree_attention import TreeAttention, node_meta
from mtpx.engine.compiled import _mark_meta_table, _mark_window, mark_batch, plan_and_draft
from mtpx.engine.decode_step import block_bucket, draft_rounds
from mtpx.spec_decode.protocol import DraftBatch, Drafts
from mtpx.models.tree_forward import TreeStates, tree_forward
from mtpx.spec_decode.tree import ancestor_mask


def tree_verify_forward(model, cache, data, parents, depths, ancestors, levels: list[tuple[int, int]]):
    """The target over tree nodes (tree_forward's contract) as one graph. data [B, T + 3 + blocks]
    int64, every per-request input in one tensor so that the graph has one batch size: each row
    [node tokens (T) | drafts verified | n, x_n's position | batch slot | block table]; the tree's
    parents, depths [T] int64 and ancestors [T, T] bool (ancestor_mask) -> (hidden [B, T, hidden],
    logits [B, T, V], [(ext, taps, ssm)] of each Gated DeltaNet layer: TreeStates' fields).
    Padding nodes (index > drafts verified) write their KV to the pad slot and change no state."""
    B, T, S = data.shape[0], parents.shape[0], cache.block_size
    # copies, not views of data: a layer region's inputs may not alias each other
    ids, nd, n, rows, table = (x.clone() for x in (data[:, :T], data[:, T], data[:, T + 1], data[:, T + 2],
                                                   data[:, T + 3:]))
    nodes = torch.arange(T, device=data.device)
    valid = nodes[None] <= nd[:, None]
    positions = n[:, None] + nodes
    slots = torch.where(valid, table.gather(1, positions // S) * S + positions % S, cache.pad_slot)
    meta = ForwardMeta(positions, valid, rows, None, table, S, slots, gdn_backend=cache.gdn_backend)
    meta.attn_backend = TreeAttention(n, n, ancestors[None].expand(B, T, T))
    h, kept = tree_forward(model, cache.target, ids, n[:, None] + depths, meta, parents[None].expand(B, T),
                           levels, cache.compile_regions)
    return h, model.lm_head(h), [(s.ext, s.taps, s.ssm) for s in kept]


def static_window(spec) -> tuple[int, int]:
    """(T, D) of a compiled tree step: the whole tree's nodes plus the root, and its depth."""
    return 1 + spec.shape.num_nodes, spec.shape.depth


class TreeVerify:
    """Tree verification through an engine's CompiledDecode `step` (module doc) for the tree
    speculator `spec`. Its graphs count in step.progress (step.num_graphs, step.compile_s)."""

    def __init__(self, step, spec):
        self.step, self.spec = step, spec
        T, D = static_window(spec)
        self.parents, self.depths = spec.parents[:T].clone(), spec.depths[:T].clone()   # [T] int64
        self.ancestors = ancestor_mask(self.parents[None], D)[0]                       # [T, T] bool
        self.name = f"tree verify ({T}-node window)"
        paths = json.dumps([list(p) for p in spec.shape.paths])
        self.fn = step.compile(tree_verify_forward, f"tree_{hashlib.sha256(paths.encode()).hexdigest()[:12]}",
                               {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
        # the graphs so far and this one: a tree engine's chain graphs never run, the choice's come first
        step.progress.expected = len(step.progress.records) + 1

    def __call__(self, model, cache, ids, n, rows, nd, levels) -> tuple[torch.Tensor, torch.Tensor,
                                                                        list[TreeStates]]:
        """tree_verify_forward over tree_step.tree_decode's windows: ids [B, T] (T the whole tree),
        n (x_n's positions), rows, nd (drafts each request verifies) [B] int64 -> (hidden, logits,
        TreeStates per Gated DeltaNet layer)."""
        data = torch.cat([ids, nd[:, None], n[:, None], rows[:, None], cache.block_tables[rows]], 1)
        args = (model, cache, data, self.parents, self.depths, self.ancestors, levels)

        def mark():
            mark_batch(data)
            torch._dynamo.mark_static(data, 1)
            for t in args[3:6]:
                torch._dynamo.mark_static(t)
        with torch.inference_mode():
            h, logits, kept = self.step.call(self.name, self.fn, args, mark)
        return h, logits, [TreeStates(*x) for x in kept]


def verify_tree(runner, ids, n, rows, nd, valid, parents, depths, D, levels):
    """The target over the step's trees (tree_step.tree_decode; nd [B]: drafts each request
    verifies): compiled through TreeVerify when the runner's step is compiled, else eager ->
    (hidden [B, T, hidden], logits [B, T, V], TreeStates of each Gated DeltaNet layer)."""
    cache, model = runner.cache, runner.model
    if runner.tree_graphs is not None:
        return runner.tree_graphs.verify(model, cache, ids, n, rows, nd, levels)
    B, T = ids.shape
    nodes = torch.arange(T, device=ids.device).expand(B, T)
    meta = node_meta(cache.block_tables[rows], cache.block_size, rows, n, nodes, valid, n,
                     ancestor_mask(parents, D), cache.gdn_backend)
    h, kept = tree_forward(model, cache.target, ids, n[:, None] + depths, meta, parents, levels)
    return h, model.lm_head(h), kept


class LeafDraft:
    """The draft round of a leaf tree (mtpx/spec_decode/tree_leaves.py: the chain speculator's round
    plus the leaves) as one compiled graph, through an engine's CompiledDecode `step`, for the
    LeafTreeSpeculator `spec`: the chain's draft graph (compiled.plan_and_draft) with D + 1
    columns (D: the tree's depth; an accepted path and its bonus are at most D + 1 tokens) and
    D modules, saved in a subfolder per tree shape. A round whose modules lag more than the
    columns allow runs a round without drafts first (decode_step.draft_rounds), as the chain's."""

    def __init__(self, step, spec):
        self.step, self.spec = step, spec
        D = spec.shape.depth
        self.columns, self.modules = D + 1, D if spec.multi else None
        self.name = f"leaf-tree draft loop ({D} module{'s' * (D > 1)}, {D + 1} columns)"
        paths = json.dumps([list(p) for p in spec.shape.paths])
        self.fn = step.compile(plan_and_draft, f"leaves_{hashlib.sha256(paths.encode()).hexdigest()[:12]}")
        step.progress.expected = len(step.progress.records) + 1

    def __call__(self, batch: DraftBatch, n_host: list[int], prev: list[int], new: list[int]) -> Drafts:
        """Speculator.propose's contract for tree_step.tree_decode's dynamic `batch` (node counts),
        made static here; n_host: x_n's positions before the step; prev, new: the drafts (nodes)
        each request held before the step and proposes now."""
        spec, cache, D = self.spec, self.step.cache, self.spec.shape.depth
        num_blocks = block_bucket(max(n_host) + 2 * D + 2, cache.block_size, cache.max_blocks)
        depth = spec.chain_depth
        lag = spec.multi and any(min(depth[b] + 1, D) > depth[a] + 1 for a, b in zip(prev, new))
        b = dataclasses.replace(batch, num_columns=self.columns, num_modules=self.modules,
                                block_table=cache.block_tables[batch.rows, :num_blocks], catch_up=lag)
        return draft_rounds(self._round, b)

    def _round(self, b: DraftBatch) -> Drafts:
        num_drafts = torch.tensor(self.spec.num_speculative_tokens if b.num_drafts is None else b.num_drafts,
                                  device=b.rows.device)
        target_start = b.target_start.new_empty(b.target_start.shape).copy_(b.target_start)
        per_row = (b.rows, b.num_tokens, b.target_end, b.is_drafting, b.depth, target_start, b.drafts)

        def mark():
            mark_batch(*per_row, b.target_hidden)
            _mark_window(b.target_hidden)
            _mark_meta_table(b.block_table)
        args = (self.spec, self.step.cache, b.block_table, *per_row, b.target_hidden, b.num_columns,
                num_drafts, b.num_modules)
        with torch.inference_mode():
            tokens, num_final = self.step.call(self.name, self.fn, args, mark)
        return Drafts(tokens, None, num_final)


def draft_tree(runner, batch: DraftBatch, n_host: list[int], prev: list[int], new: list[int]) -> Drafts:
    """The round after a tree verification (tree_step.tree_decode): a leaf tree's through LeafDraft
    when the runner's step is compiled, else the tree speculator's propose, eager."""
    spec = runner.tree_spec
    if runner.tree_graphs is None or not spec.leaves:
        return spec.propose(runner.cache, batch)
    return runner.tree_graphs.draft(batch, n_host, prev, new)


class TreeGraphs:
    """The compiled graphs of an engine's tree steps, each built on first use on the engine's
    CompiledDecode `step` for the tree speculator `spec`: `verify` (TreeVerify) and, for a leaf
    tree, `draft` (LeafDraft). Owned by the model runner (its `tree_graphs`)."""

    def __init__(self, step, spec):
        self.step, self.spec = step, spec
        self._verify: TreeVerify | None = None
        self._draft: LeafDraft | None = None

    def verify(self, *args) -> tuple[torch.Tensor, torch.Tensor, list[TreeStates]]:
        """TreeVerify.__call__."""
        if self._verify is None:
            self._verify = TreeVerify(self.step, self.spec)
        return self._verify(*args)

    def draft(self, *args) -> Drafts:
        """LeafDraft.__call__."""
        if self._draft is None:
            self._draft = LeafDraft(self.step, self.spec)
        return self._draft(*args)
