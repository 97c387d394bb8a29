"""engine.compile: the decode step as three functions compiled with torch.compile, behind the DecodeStep
interface (mtpx/engine/decode_step.py, whose EagerStep runs the same functions eager):

    verify(meta)            -> verify_forward(model, cache, meta)      the target over the windows
    commit(accepted, save)  -> cache.commit_recurrent(accepted, save)  Gated DeltaNet states, accepted
    draft(batch)            -> speculator.propose(cache, batch)        the N-step round, re-prefill included

Shapes (StepShapes in decode_step.py): a window of k + 1 columns per depth bucket, each width a graph
with its width a constant; block tables cut to a power-of-two block count. The batch, the block count
and the packed token count N of a ragged window (engine.ragged_batch) are dynamic (size-oblivious, no
duck sizing), so one graph per function and width serves every size and later steps never recompile
(tests/test_compiled.py, with error_on_recompile); the warm-up compiles at batch 2 first, so batch 1
runs in the same graphs. CUDA pads a batch to a capture size and replays CUDA graphs
("reduce-overhead"); the CPU runs it unpadded in the default mode. Nothing depends on a tensor's value
(padding writes go to the pad slot): no graph breaks on a dense model, no host syncs.

Regions (engine.compile_regions, on by default): every decoder layer is a nested_compile_region
(mtpx.models.decoder.layer_region), compiled once per layer type and shape, with Inductor's Python
wrapper. Eager inside the graph (breaks): the FlashInfer call and MoE routed experts (then the step is
one graph). Eager outside it: prefill chunks, the catch-up after them, sampled draft loops.

Caches: each graph whole under $MTPX_CACHE_DIR/precompiled (engine.compile_cache; precompile.py), and
Inductor's under $MTPX_CACHE_DIR/inductor (compile_progress.py, which shows each graph as it builds).
Build times and their history: docs/compiled_step.md.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.fx.experimental._config as fx_config

from mtpx.attention.meta import ForwardMeta
from mtpx.engine.compile_cache import usable_cache
from mtpx.engine.compile_progress import CompileProgress, use_cache_dir
from mtpx.io import mtpx_cache_dir
from mtpx.engine.decode_step import (block_bucket, capture_sizes, depth_bucket,  # noqa: F401 (re-exported)
                                     draft_rounds, verify_forward)
from mtpx.engine.precompile import Precompiled, own_code as _own_code, precompile_key  # noqa: F401 (tests)
from mtpx.spec_decode.protocol import DraftBatch, Drafts
from mtpx.structured import draft_op


def commit_windows(cache, index: torch.Tensor) -> None:
    """cache.commit_windows (ModelCache's contract): the compiled Gated DeltaNet commit."""
    cache.commit_windows(index)


def plan_and_draft(speculator, cache, block_table, rows, num_tokens, target_end, is_drafting, depth,
                   target_start, drafts, target_hidden, num_columns, num_drafts, num_modules):
    """speculator.propose (its contract) over a static DraftBatch built here, as one graph:
    -> (Drafts.tokens, Drafts.num_final)."""
    batch = DraftBatch(rows, num_tokens, target_end, is_drafting, depth, target_start, target_hidden,
                       num_drafts, num_modules, num_columns, block_table, drafts=drafts)
    drafts = speculator.propose(cache, batch)
    return drafts.tokens, drafts.num_final


def propose_planned(speculator, cache, plan, rows, num_tokens, target_end, is_drafting, depth,
                    target_start, drafts, target_hidden):
    """speculator.propose (its contract) with its plan made eager before (FlashInfer):
    -> (Drafts.tokens, Drafts.num_final)."""
    batch = DraftBatch(rows, num_tokens, target_end, is_drafting, depth, target_start, target_hidden,
                       drafts=drafts)
    drafts = speculator.propose(cache, batch, plan)
    return drafts.tokens, drafts.num_final


def mark_batch(*tensors: torch.Tensor) -> None:
    # maybe_: code after a graph break (MoE experts, FlashInfer, the check_invariants guard) may
    # specialize a size; its frame then recompiles once as dynamic (automatic dynamic shapes)
    for t in tensors:
        torch._dynamo.maybe_mark_dynamic(t, 0)


def _mark_meta_table(block_table: torch.Tensor) -> None:
    mark_batch(block_table)
    torch._dynamo.maybe_mark_dynamic(block_table, 1)


def _mark_window(*tensors: torch.Tensor) -> None:
    # a graph per window width (1 or k + 1 tokens), the width a constant: without this,
    # Dynamo's automatic dynamic shapes recompile on the first width change into a graph with a
    # symbolic width (seen for automatic k's 1-token forward; tests/test_compiled.py)
    for t in tensors:
        torch._dynamo.mark_static(t, 1)


def _mark_meta(meta: ForwardMeta) -> None:
    mark_batch(meta.positions, meta.valid, meta.rows, meta.slot_mapping, meta.block_table)
    _mark_window(meta.positions, meta.valid, meta.slot_mapping)
    torch._dynamo.maybe_mark_dynamic(meta.block_table, 1)
    if meta.packed is not None:     # a ragged window's tokens: one graph for every count
        mark_batch(meta.packed)


class CompiledDecode:
    """The compiled verification forward and draft loop of one engine (module doc); a DecodeStep
    (mtpx/engine/decode_step.py) with static shapes.

    model, cache, speculator: the engine's (speculator None: plain decoding, only the
    verification forward of one token); backend: torch.compile's backend ("inductor"; tests use
    "eager" or "aot_eager" to check tracing without code generation); mode: None for the device's
    default ("reduce-overhead" on CUDA, Inductor's default on the CPU); report: show the build
    (CompileProgress); precompile: save and load whole graphs (engine.compile_cache); ragged:
    the runner packs the verification windows (engine.ragged_batch; part of the saved graphs' key,
    as their inputs differ).

    Attributes: compile_s (seconds spent in calls that compiled a graph), num_graphs (graphs
    compiled by this object's functions), num_calls (compiled calls made), sizes (capture sizes;
    None on the CPU, where batches run unpadded),
    precompile_dir (where whole graphs are saved and loaded, None where they cannot be: CUDA,
    FlashInfer, MoE, tensor parallelism, engine.compile_cache=false), cache_dir (that folder, else
    Inductor's).
    Call verify and draft under torch.inference_mode, as the model runner does: the grad mode and the
    kind of tensor are guards, so another mode would compile the functions again.
    """

    static = True

    def __init__(self, model, cache, speculator=None, backend: str = "inductor",
                 mode: str | None = None, report: bool = True, precompile: bool = True,
                 ragged: bool = True):
        self.model, self.cache, self.speculator, self.ragged = model, cache, speculator, ragged
        self.cache_dir = use_cache_dir()
        self.progress = CompileProgress(self.expected_graphs(), enabled=report)
        device = next(model.parameters()).device
        self.cuda = device.type == "cuda"
        if mode is None:
            mode = "reduce-overhead" if self.cuda and backend == "inductor" else None
        self.mode, self.backend = mode, backend
        # CUDA graphs are recorded per batch size: pad to vLLM's capture sizes there; on the CPU one
        # graph serves every batch (its batch dimension is dynamic), so a batch runs unpadded
        self.sizes = capture_sizes(cache.rows) if self.cuda else None
        self.num_calls = 0
        # per-call costs at batch 1 on the CPU (experiments/step_costs): no guards on the modules
        # (an engine never swaps its model's weights, and each engine compiles its own code), and
        # Inductor's C++ wrapper instead of a Python one that launches every kernel
        options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
        if backend == "inductor" and not self.cuda and not cache.compile_regions:
            options["cpp_wrapper"] = True   # which has no code generation for layer regions
        # with the torch attention backend nothing of the plan is host-side: plan inside the graph
        self.plan_in_graph = speculator is not None and cache.attention_backend.name == "torch"
        # whole graphs saved across runs (precompile.py): on the CPU, where nothing breaks the graph
        self.precompile_dir = None
        # (aot_eager: the same path without code generation, for the tests; torch 2.13 cannot
        # run a loaded aot_eager graph with layer regions)
        savable = backend == "inductor" or (backend == "aot_eager" and not cache.compile_regions)
        # not under tensor parallelism (its graphs hold collectives; not yet tried saved)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        cache_ok = usable_cache()   # else one warning line, and nothing is saved (compile_cache.py)
        if (precompile and savable and cache_ok and not self.cuda and not distributed
                and cache.attention_backend.name == "torch" and getattr(model.cfg, "num_experts", 0) == 0):
            self.precompile_dir = mtpx_cache_dir() / "precompiled" / precompile_key(self._key_parts(options))
            self.cache_dir = str(self.precompile_dir)

        self._options, self._draft_masked = options, None
        self._verify = self.compile(verify_forward)
        self._draft = (None if speculator is None else
                       self.compile(plan_and_draft if self.plan_in_graph else propose_planned))
        has_windows = speculator is not None and bool(cache.recurrent)
        self._commit = self.compile(commit_windows) if has_windows else None
        if self.precompile_dir is None:
            self._mark_persistent()

    def _key_parts(self, options: dict) -> dict:
        """What the saved graphs depend on (precompile_key adds torch, threads and mtpx's source)."""
        model, cache, spec = self.model, self.cache, self.speculator
        p = next(model.parameters())
        return {"model": repr(model.cfg), "dtype": str(p.dtype), "device": str(p.device),
                "tensors": [(tuple(t.shape), str(t.dtype)) for t in self._persistent_tensors()],
                "speculator": None if spec is None else (type(spec).__name__, spec.num_speculative_tokens),
                "draft_modules": len(cache.draft), "regions": cache.compile_regions,
                "attention": cache.attention_backend.name, "gdn": cache.gdn_backend,
                "backend": self.backend, "mode": self.mode, "ragged": self.ragged,
                "options": sorted(k for k in options if k != "guard_filter_fn")}

    def _mark_persistent(self) -> None:
        for t in self._persistent_tensors():
            # static sizes: never symbolic through automatic dynamic shapes (in a run of several
            # engines, mtp8's window buffers once came out symbolic after mtp1's, and Inductor
            # failed to lower their writes)
            torch._dynamo.mark_static(t)
            if self.cuda:  # CUDA graphs may mutate these in place: give them fixed addresses
                torch._dynamo.mark_static_address(t)

    def _patches(self):
        # graphs per window width and module count (automatic k's depths): up to 2 (k + 1) each;
        # int arguments (column and module counts) constants of the graph, never symbolic (as
        # automatic dynamic shapes would make them on their first change; see _mark_window)
        limit = max(torch._dynamo.config.recompile_limit, 4 * (len(self.cache.draft) + 2))
        stack = contextlib.ExitStack()
        stack.enter_context(fx_config.patch(backed_size_oblivious=True, use_duck_shape=False))
        stack.enter_context(torch._dynamo.config.patch(recompile_limit=limit, specialize_int=True))
        return stack

    def _persistent_tensors(self):
        c = self.cache
        yield c.tokens
        for kv in c.kv_caches:
            yield kv.k
            yield kv.v
        for g in c.recurrent_groups:
            yield from (t for t in (g.conv, g.ssm, g.window_k, g.window_v_new, g.window_G, g.window_ext)
                        if t is not None)
        if self.speculator is not None:
            yield from self.speculator.buffers

    def padded_batch(self, batch: int) -> int:
        """The capture size a batch of `batch` requests is padded to (CUDA); the batch itself on
        the CPU."""
        return batch if self.sizes is None else next(s for s in self.sizes if s >= batch)

    def packed_tokens(self, num_tokens: int, grid_tokens: int) -> int:
        """The token grid of a ragged verification forward: its real tokens on the CPU (one graph
        serves every count), the next multiple of 8 (at most the grid) on CUDA, where a CUDA
        graph is recorded per size."""
        return min(grid_tokens, -(-num_tokens // 8) * 8) if self.cuda else num_tokens

    @property
    def num_graphs(self) -> int:
        """Graphs built by this object's functions (compiled or loaded from the cache)."""
        return len(self.progress.records)

    @property
    def compile_s(self) -> float:
        """Seconds spent in calls that built a graph."""
        return sum(r["seconds"] for r in self.progress.records)

    def expected_graphs(self) -> int:
        """Graphs the warm-up is expected to build (the total CompileProgress shows): the
        verification forward, and with a speculator the draft loop at its two widths and the
        Gated DeltaNet commit."""
        if self.speculator is None:
            return 1
        return 2 + bool(self.cache.recurrent)

    def compile(self, fn, subfolder: str | None = None, options: dict | None = None):
        """fn compiled as this step's graphs are (its own code object; saved and loaded under the
        step's precompile folder, or `subfolder` of it, where graphs are saved), with the step's
        torch.compile options unless `options` is given."""
        fn, options = _own_code(fn), self._options if options is None else options
        if self.precompile_dir is not None:
            folder = self.precompile_dir if subfolder is None else self.precompile_dir / subfolder
            return Precompiled(fn, folder, self.backend, options, self._patches, self._persistent_tensors,
                               self._mark_persistent)
        return torch.compile(fn, backend=self.backend, mode=self.mode, options=dict(options))   # (pops keys)

    def call(self, name: str, fn, args: tuple, mark):
        """fn(*args), reported as `name` if it builds a graph; mark() applies the arguments'
        dimension marks (before every call of a torch.compile'd function; a precompiled one
        applies them only to compile)."""
        self.num_calls += 1
        if isinstance(fn, Precompiled):
            return fn.call(name, args, mark, self.progress)
        mark()
        with self._patches(), self.progress.call(name):
            return fn(*args)

    @torch.inference_mode()
    def verify(self, meta: ForwardMeta):
        """verify_forward compiled (its contract)."""
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        return self.call(f"verify ({meta.positions.shape[1]}-token window)", self._verify,
                          (self.model, self.cache, meta), lambda: _mark_meta(meta))

    @torch.inference_mode()
    def draft(self, batch: DraftBatch) -> Drafts:
        """speculator.propose compiled (its contract), for a static batch (num_columns and
        block_table set; num_drafts an int, passed to the graph as a 0-d tensor; num_modules None:
        all): one graph
        per pair of column and module counts. The plan is part of the graph with the torch
        attention backend; with FlashInfer, whose plans are host-side, it runs eager before the
        compiled round. A batch with a sampler (probabilistic drafts) runs eager, except argmax
        drafts under a grammar mask on the CPU (their own graph: mtpx/structured/draft_op.py). A catch-up
        round first where batch.catch_up (decode_step.draft_rounds: the same graph twice); the
        hidden states of a 1-token window are padded to the round's columns (never read)."""
        return draft_rounds(self._draft_round, batch)

    def _draft_round(self, batch: DraftBatch, masked=None) -> Drafts:
        if batch.sampler is not None:
            # (not in CUDA graphs: the operator reads each draft on the host)
            if self.cuda or not (self.plan_in_graph and draft_op.in_graph(batch.sampler)):
                return self.speculator.propose(self.cache, batch)
            if self._draft_masked is None:      # argmax drafts under the grammar mask, compiled
                self._draft_masked = self.compile(draft_op.plan_and_draft_masked)
            with draft_op.active(batch.sampler):
                return self._draft_round(dataclasses.replace(batch, sampler=None), self._draft_masked)
        k, b = self.speculator.num_speculative_tokens, batch
        width = b.target_hidden.shape[1]
        if width < b.num_columns:     # a 1-token window in the round of k + 1 columns: one graph
            b = dataclasses.replace(b, target_hidden=torch.nn.functional.pad(
                b.target_hidden, (0, 0, 0, b.num_columns - width)))
        num_drafts = torch.tensor(k if b.num_drafts is None else b.num_drafts, device=b.rows.device)
        # a fresh [B] tensor: target_start is a column of the window's positions, and for a batch
        # of one contiguous() would keep its stride, which the graph guards on (a recompile)
        target_start = b.target_start.new_empty(b.target_start.shape).copy_(b.target_start)
        drafts = b.depth if b.drafts is None else b.drafts          # DraftBatch.drafts' None: each its depth
        per_row = (b.rows, b.num_tokens, b.target_end, b.is_drafting, b.depth, target_start, drafts)
        modules = len(self.cache.draft) if b.num_modules is None else b.num_modules
        name = (f"draft loop{' under the grammar mask' * (masked is not None)} ({modules} "
                f"module{'s' * (modules > 1)}, {b.num_columns} columns)")
        block_table = b.block_table
        if self.plan_in_graph:
            def mark():
                mark_batch(*per_row, b.target_hidden)
                _mark_window(b.target_hidden)
                _mark_meta_table(block_table)
            args = (self.speculator, self.cache, block_table, *per_row, b.target_hidden, b.num_columns,
                    num_drafts, b.num_modules)
            tokens, num_final = self.call(name, self._draft if masked is None else masked, args, mark)
        else:
            plan = self.speculator.plan(self.cache, DraftBatch(*per_row[:6], b.target_hidden, num_drafts,
                                                               b.num_modules, b.num_columns, block_table,
                                                               drafts=drafts))

            def mark_eager_plan():
                mark_batch(*per_row, b.target_hidden)
                _mark_window(b.target_hidden)
                for m in plan.metas:
                    _mark_meta(m)
            tokens, num_final = self.call(name, self._draft, (self.speculator, self.cache, plan, *per_row,
                                                               b.target_hidden), mark_eager_plan)
        return Drafts(tokens, None, num_final)

    @torch.inference_mode()
    def commit(self, index: torch.Tensor, save: tuple | None = None) -> None:
        """cache.commit_recurrent with its tensor work compiled (one graph for every Gated DeltaNet
        layer, batched over each group's stacked states); the boundary states `save` (a few per
        block end, a count known on the host) are stored eager first."""
        groups = self.cache.recurrent_groups
        if self._commit is None or groups[0].pending_rows is None:
            self.cache.commit_recurrent(index, save)
            return
        if save is not None:
            for c in self.cache.recurrent:
                c.save_window_blocks(save)
        self.call(f"commit ({groups[0].pending_len}-token window)", self._commit, (self.cache, index),
                   lambda: mark_batch(index, *(g.pending_rows for g in groups)))
        self.cache.clear_pending()
