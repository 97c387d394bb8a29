"""EngineConfig: every setting of the decoding engine, validated once (vLLM's names)."""
from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from typing import Any, Literal

from mtpx.models.config import check_choice, literal_choices
from mtpx.spec_decode.acceptance import AcceptanceConfig

SPEC_KEYS = ("verify", "draft_sample_method", "tree", *(f.name for f in dataclasses.fields(AcceptanceConfig)))
"""The engine settings that the spec group sets (spec.verify, spec.draft_sample_method, spec.tree,
the acceptance rule's keys)."""


@dataclass
class EngineConfig(AcceptanceConfig):
    """Raises ValueError in __post_init__ naming the config key for a value the engine cannot run
    with; limits that depend on the model (max_model_len, the window) are checked by Engine."""

    max_num_seqs: int = 64
    """Running requests at most (batch slots)."""
    max_model_len: int | None = None
    """Positions per request, prompt plus output (None: the model's max_position_embeddings)."""
    block_size: int = 16
    """Tokens per paged KV block."""
    num_blocks: int | None = None
    """KV blocks in the pool (None: enough for max_num_seqs requests of max_model_len, so nothing
    is ever preempted)."""
    enable_prefix_caching: bool = False
    """Share full KV blocks between requests by content (mtpx/core/kv_cache_manager.py)."""
    max_num_batched_tokens: int = 2048
    """Target tokens per engine step; prompts are prefilled in chunks to fit."""
    verify: Literal["standard", "block"] = "standard"
    """Verification of drafts at temperature > 0: "standard" (token-level speculative sampling)
    or "block" (block verification); greedy requests verify by argmax either way."""
    draft_sample_method: Literal["greedy", "probabilistic"] = "greedy"
    """At temperature > 0: "greedy" (argmax drafts, one-hot draft distribution, as vLLM) or
    "probabilistic" (drafts sampled from the draft distribution)."""
    structured_outputs_mask_drafts: bool = True
    """A structured-output request's drafts are proposed under its grammar mask (each draft from
    the draft logits masked by the grammar state after the drafts before it; the draft loop of a
    batch with such a request runs eager, reading each draft on the host); False: drafts are
    proposed unmasked (the target's columns are masked either way; docs/structured_output.md)."""
    structured_outputs_disable_any_whitespace: bool = False
    """vLLM's structured_outputs_config.disable_any_whitespace (the Python API takes
    structured_outputs_config={"disable_any_whitespace": true} too): every JSON-schema and
    json_object constraint gives JSON without optional whitespace (xgrammar's any_whitespace=False),
    as a request's own StructuredOutputsParams.disable_any_whitespace does."""
    tree: Any = None
    """Tree drafting (docs/trees.md): null (chain drafts), a list of widths per depth ([3, 2, 1]:
    top-3 children of the root, top-2 of each of those, ...) or a list of paths of sibling ranks
    ([[0], [1], [0, 0]], Medusa / EAGLE "choices"), or {num_draft_tokens, depth, topk} (EAGLE-2's
    dynamic tree). Eager and the torch attention only."""
    attention_backend: Literal["torch", "flashinfer"] = "torch"
    """Paged attention: "torch" (CPU or GPU; on the CPU, float32 windows of up to 32 tokens run
    mtpx's C kernel, which reads keys and values from their blocks in place) or "flashinfer"
    (CUDA; mtpx.attention.backend.get_backend refuses it without a CUDA device)."""
    gdn_backend: Literal["auto", "torch", "fla"] = "auto"
    """Gated DeltaNet kernels: "auto" (flash-linear-attention's on CUDA when installed, the
    plain-PyTorch forms otherwise), "torch" (always the plain forms) or "fla" (a missing fla or
    non-CUDA tensors are an error); mtpx.models.gated_delta_rule."""
    compile: bool | None = None
    """Run the decode step through torch.compile with static shapes (mtpx/engine/compiled.py).
    null (the default) decides by where it pays (`resolve_compile`): mode=serve and mode=bench
    compile; mode=eval and mode=distill compile when they decode at least COMPILE_MIN_TOKENS
    output tokens (num_prompts x max_tokens; the whole data set counts as enough); the Python
    API (LLM) runs eager (pass compile=True for long runs)."""
    ragged_batch: bool = True
    """Forwards run their token-wise work (embedding, norms, projections, MLP, lm_head) on the
    real tokens alone, flattened (ForwardMeta.packed), so a decode step whose requests verify
    different numbers of drafts, or a prefill of chunks of different lengths, costs its tokens
    rather than B times its widest window; attention and the Gated DeltaNet verification windows
    see the padded grid, where the CPU kernels skip the padding (a prefill runs Gated DeltaNet
    packed too, docs/engine.md). The compiled step packs its verification windows (the token
    count a dynamic size of the graph; its padded batch rows dropped too), its 1-token windows
    and draft rounds keep the static grid. False: every op sees the [B, T] grid (the reference)."""
    per_request_k: bool = False
    """With automatic k and ragged_batch (eager or compiled): each request verifies its own number
    of the drafts it holds every step (AutoDraftLength.allocate, docs/automatic_k.md), instead of
    every request verifying the step's k. Off by default: on the demo (2 CPU cores, eager) it
    read 0.89x the best fixed k at concurrency 1 and 16 against 0.97x-1.04x at 4 and 64
    (experiments/concurrency), and 0.89-0.99x at 16 and 4 once the Gated DeltaNet windows skipped
    their padding (experiments/concurrency/ragged_gdn): each trimmed draft loses its expected
    tokens, and its allocation verified 4-5 drafts for nearly every request anyway."""
    compile_regions: bool = True
    """With compile: compile each distinct decoder layer once and reuse it for every layer of its
    type and shape (regional compilation, torch.compiler.nested_compile_region), so building an
    engine costs seconds instead of minutes; False: the step as one graph of every layer, which
    builds in minutes a graph (once: compile_cache) and runs the plain CPU step fastest
    (Inductor's C++ wrapper; docs/compiled_step.md). Used with the torch attention backend on a
    model without MoE layers (elsewhere a layer breaks the graph, and the whole step is compiled
    as before)."""
    compile_cache: bool = True
    """With compile on the CPU: save each compiled graph whole (Dynamo's bytecode and guards with
    Inductor's code; torch.compile's AOT precompile) under $MTPX_CACHE_DIR/precompiled, keyed by
    the model, the engine's shapes, torch, the thread count and mtpx's source, and load it in a
    later run instead of tracing and compiling again (mtpx/engine/precompile.py). False: only
    Inductor's caches are kept, and every run traces its graphs again."""
    compile_depths: list[int] | None = None
    """With compile and automatic k: the draft depths the compiled step is built for; a step's
    verification window and draft round are padded to the next of them above its deepest
    request. None: 0, num_speculative_tokens // 2 (from 4 on) and num_speculative_tokens, so
    automatic k builds the graphs of plain decoding, of half the fixed k and of the fixed k (7
    against 3 on the demo's mtp8, about 80 s more cold at 1 thread; [0, 8] alone ran plain decoding
    where mtp4 paid: experiments/concurrency/explore_budget); [0, 1, 2, 4, 8]: every power of two
    (13 graphs, several minutes more cold; experiments/compile_time). Eager steps are never
    padded."""
    compile_backend: str = "inductor"
    """torch.compile's backend ("eager" / "aot_eager" trace without code generation: tests); any
    name in torch._dynamo.list_backends(exclude_tags=()), else ValueError."""
    tensor_parallel_size: int = 1
    """Ranks (processes) the model is split over by tensor parallelism (vLLM's name;
    docs/tensor_parallel.md): rank 0 runs the scheduler and starts the other N-1 itself, or all
    N run under `torchrun --nproc_per_node=N`. Needs a checkpoint folder."""
    record_logit_gaps: bool = False
    """Keep the top-2 logit gap of every emitted token (lossless checks, near-tie analysis)."""
    record_step_timings: bool = True
    """Keep a StepTiming per step (on CUDA this synchronizes the device at each phase)."""
    tune_malloc: bool = True
    """On the CPU with glibc: keep freed memory in the process (mallopt, mtpx/engine/malloc.py:
    blocks up to 32 MiB from a heap that is trimmed only above 1 GiB free), so that each step's
    temporaries reuse pages instead of faulting in fresh ones (the plain eager step at batch 64
    took about a third less time; experiments/lean_step). Set once per process by the first CPU
    engine; MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or MALLOC_TOP_PAD_ in the environment
    take precedence (nothing is set then)."""
    check_invariants: bool = False
    """Assert on every KV write that no published or free block is written, and the block pool's
    bookkeeping after every step (tests)."""

    def __post_init__(self):
        def integer(key, value, low, none_ok=False):
            if value is None and none_ok:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"engine.{key}={value!r}: must be an integer >= {low}"
                                 + (" or null" if none_ok else ""))

        if self.tree is not None:
            from mtpx.spec_decode.tree import build_tree_shape, plain_tree
            self.tree = plain_tree(self.tree)
            build_tree_shape(self.tree)              # a bad shape: one line naming spec.tree
        if self.compile is not None and not isinstance(self.compile, bool):
            raise ValueError(f"engine.compile={self.compile!r}: must be true, false or null "
                             "(decided by the mode)")
        for key in ("enable_prefix_caching", "ragged_batch", "per_request_k", "compile_regions",
                    "compile_cache", "record_logit_gaps", "record_step_timings", "tune_malloc",
                    "check_invariants"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"engine.{key}={getattr(self, key)!r}: must be true or false")
        self.check_acceptance()
        integer("max_num_seqs", self.max_num_seqs, 1)
        integer("max_model_len", self.max_model_len, 2, none_ok=True)
        integer("block_size", self.block_size, 1)
        integer("num_blocks", self.num_blocks, 1, none_ok=True)
        integer("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        integer("tensor_parallel_size", self.tensor_parallel_size, 1)
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(f"engine.block_size={self.block_size} is larger than "
                             f"engine.max_num_batched_tokens={self.max_num_batched_tokens} (a step must fill "
                             "at least one block): use a block size of 16 to 256, or raise "
                             "engine.max_num_batched_tokens")
        for key, choices in literal_choices(EngineConfig).items():
            check_choice(f"{'spec' if key in SPEC_KEYS else 'engine'}.{key}", getattr(self, key), choices)
        if self.compile_depths is not None and (
                isinstance(self.compile_depths, (str, bytes)) or not hasattr(self.compile_depths, "__iter__")
                or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in self.compile_depths)):
            raise ValueError(f"engine.compile_depths={self.compile_depths!r}: give a list of draft depths "
                             ">= 0, e.g. [0, 2, 8], or null (0 and num_speculative_tokens)")
        if self.compile_backend not in ("inductor", "eager", "aot_eager"):
            if not isinstance(self.compile_backend, str):
                raise ValueError(f"engine.compile_backend={self.compile_backend!r}: give a torch.compile "
                                 "backend name, e.g. inductor")
            import torch._dynamo
            backends = torch._dynamo.list_backends(exclude_tags=())
            if self.compile_backend not in backends:
                usual = sorted({*torch._dynamo.list_backends(), "eager", "aot_eager"})
                close = difflib.get_close_matches(self.compile_backend, usual, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                raise ValueError(f"engine.compile_backend={self.compile_backend!r} is not a torch.compile "
                                 f"backend: {hint}choose one of {', '.join(usual)} "
                                 "(torch._dynamo.list_backends())")


COMPILE_MIN_TOKENS = 4096
"""Output tokens from which eval and distill compile by default. On the demo (2 CPU cores,
experiments/compile_time) a cold build takes about a minute and a warm one seconds, and a
compiled step saves 8 to 28 ms per token at concurrency 1 (compiled mtp8 2.1x and plain 3.5x
eager): 4,096 tokens pay for a cold build of plain decoding, and for mtp8 from its second run."""


def resolve_compile(compile: bool | None, mode: str, num_output_tokens: int | None = None) -> bool:
    """engine.compile for a run of `mode` ("eval", "bench", "serve", "distill" or "api"):
    true or false as given; None (the default) by the rule of EngineConfig.compile, with
    num_output_tokens the run's num_prompts x max_tokens (None: the whole data set), unless the
    environment sets MTPX_COMPILE=0 or 1 (the test suite runs eager with 0)."""
    if compile is not None:
        return compile
    if os.environ.get("MTPX_COMPILE") in ("0", "1"):
        return os.environ["MTPX_COMPILE"] == "1"
    if mode in ("serve", "bench"):
        return True
    if mode in ("eval", "distill"):
        return num_output_tokens is None or num_output_tokens >= COMPILE_MIN_TOKENS
    return False


def with_overrides(config: EngineConfig | None, **overrides) -> EngineConfig:
    """`config` (default EngineConfig()) with `overrides` of its fields, validated. Raises
    ValueError naming an unknown field and the closest one."""
    fields = [f.name for f in dataclasses.fields(EngineConfig)]
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"did you mean {close[0]}?" if close else f"choose from {', '.join(fields)}"
            raise ValueError(f"unknown engine setting {key!r} (engine.{key}): {hint}")
    return dataclasses.replace(config or EngineConfig(), **overrides)

