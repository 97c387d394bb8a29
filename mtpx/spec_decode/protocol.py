"""The contract between the model runner and a speculator (both MTP speculators implement it).

A round of drafting (after a verification, or the catch-up after a prefill chunk) is one call,
`propose(DraftBatch) -> Drafts`. Inside it, `plan` builds the metadata of every module forward of
the round before the loop (the attention backend plans them then) and changes no state; the loop
runs them, drafts, and records the modules' progress. With static metadata (num_columns given) the
round has fixed shapes, reads no tensor value on the host, and is what engine.compile compiles
(with FlashInfer, whose plans are host-side, `plan` runs eager and its DraftPlan goes to the
compiled `propose`).

Shapes: B requests (a padded batch: padding rows use ModelCache's pad row, is_drafting False,
depth 0, num_tokens 1, target_end 0, and come after the real rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from mtpx.attention.meta import ForwardMeta
from mtpx.cache.model_cache import ModelCache


@dataclass
class DraftBatch:
    """One round's requests.

    rows, num_tokens, target_end, depth: [B] int64; is_drafting: [B] bool.
    num_tokens: known tokens (x_0 .. x_n, n = num_tokens - 1; for a drafting row every verified
        token). target_end: one past the target's last computed position (rows that do not draft,
        mid-prefill, only catch up to what their inputs allow). depth: the row's draft depth
        (Request.draft_depth, the one copy): modules 1..depth run for it and it drafts at most
        depth tokens (single-module MTP: ignored, its one module always runs).
    target_start [B], target_hidden [B, T, hidden]: the target's newly computed positions
        target_start + t and their hidden states.
    num_drafts: drafts this round: an int (later drafts draw no logits), a 0-d int64 tensor
        inside a compiled graph (later drafts are computed and ignored), None: all
        num_speculative_tokens; a row drafts at most its depth, and every module of its depth
        still advances over the verified tokens.
    num_modules: the round runs modules 1..num_modules only (an int, at least every row's depth;
        None: all). num_columns, block_table (both or neither): static metadata of num_columns
        columns reading the blocks of block_table [B, num_blocks] (the verification forward's, whose
        width is the static forwards' block count); None: dynamic (a forward with nothing to do is
        left out).
    sampler: None (argmax drafts) or a mtpx.spec_decode.sampler.DraftSampler (eager only).
    drafts: [B] int64, the drafts each row proposes this round (the scheduler's
        ScheduledDecode/ScheduledPrefill.num_new_drafts, 0 for rows that do not draft and for
        padding; multi-module MTP runs its module after them to the last known token); None:
        every row its depth.
    catch_up: (static) the modules' catch-up needs more than num_columns columns: the decode
        step runs a round without drafts first (mtpx.engine.decode_step.draft_rounds).
    """

    rows: torch.Tensor
    num_tokens: torch.Tensor
    target_end: torch.Tensor
    is_drafting: torch.Tensor
    depth: torch.Tensor
    target_start: torch.Tensor
    target_hidden: torch.Tensor
    num_drafts: int | torch.Tensor | None = None
    num_modules: int | None = None
    num_columns: int | None = None
    block_table: torch.Tensor | None = None
    sampler: object | None = None
    catch_up: bool = False
    drafts: torch.Tensor | None = None

    @property
    def num_blocks(self) -> int | None:
        """Blocks the static forwards read (block_table's width), None when dynamic."""
        return None if self.block_table is None else self.block_table.shape[1]


@dataclass
class DraftPlan:
    """A round's module forwards (metas, in order) and, per module forward, each row's computed
    positions [B] once it has run (recorded by `propose`, not by `plan`)."""

    metas: list[ForwardMeta]
    computed: list[torch.Tensor]


@dataclass
class Drafts:
    """tokens: [B, num_speculative_tokens] int64 (garbage for rows that do not draft and beyond
    the drafts asked for), also written to the token buffer at n + 1 ..; probs: [B, k, V] draft
    distributions (DraftSampler.q) or None; num_final: [B] positions [0, P) whose KV is final in
    every module of the row's depth, given that the modules read x_0 .. x_{num_tokens - 1}."""

    tokens: torch.Tensor
    probs: torch.Tensor | None
    num_final: torch.Tensor


class Speculator(Protocol):
    num_speculative_tokens: int    # drafts proposed per round
    num_draft_modules: int         # MTP modules whose KV lives in the paged cache
    num_lookahead_tokens: int      # tokens after a position that its module KV depends on
    buffers: list[torch.Tensor]    # state mutated in place across steps (after allocate; CUDA graphs
                                   # and saved graphs need their shapes and addresses fixed)

    def allocate(self, cache: ModelCache) -> None:
        """Allocate per-row state for `cache`'s batch slots (and its pad row), once."""

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0) -> None:
        """New or resumed requests in `rows`: every module has computed positions [0, start)."""

    def hold(self, rows: torch.Tensor, depth: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
        """A decode step without a round for `rows` (lazy catch-up, mtpx/engine/lazy_catch_up.py):
        the modules stay where they are, and positions whose KV read a draft that the step's
        verification did not keep count as not computed (num_tokens [B]: known tokens after the
        step); -> num_final [B] (Drafts.num_final's meaning)."""

    def plan(self, cache: ModelCache, batch: DraftBatch) -> DraftPlan:
        """The metadata of the round's module forwards; changes no state."""

    def propose(self, cache: ModelCache, batch: DraftBatch, plan: DraftPlan | None = None) -> Drafts:
        """Run the round (`plan(cache, batch)` unless given) and record the modules' progress."""
