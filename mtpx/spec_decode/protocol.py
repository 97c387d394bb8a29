"""The contract between the model runner and a speculator (both MTP speculators implement it).

A decode round (and the catch-up after a prefill chunk) is two calls: `plan` builds the metadata
of every module forward of the round, before the loop (the attention backend plans them then);
`draft_loop` runs them and drafts. With static metadata (num_columns given), the loop has fixed
shapes, reads no tensor value on the host, and is what engine.compile compiles.

Shapes: B requests (a padded batch: padding rows use ModelCache's pad row, is_drafting False,
num_tokens 1, target_end 0, and come after the real rows); rows, num_tokens, target_start,
target_end, is_drafting: [B]; target_hidden [B, T, hidden] over the target's newly computed
positions target_start + t.
"""
from __future__ import annotations

from typing import Protocol

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.attention.meta import ForwardMeta


class Speculator(Protocol):
    num_speculative_tokens: int    # drafts proposed per round
    num_draft_modules: int         # MTP modules whose KV lives in the paged cache
    num_lookahead_tokens: int      # tokens after a position that its module KV depends on

    def allocate(self, cache: ModelCache) -> None:
        """Allocate per-row state for `cache`'s batch slots (and its pad row), once."""

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0, depth: int | None = None) -> None:
        """New or resumed requests in `rows`: every module has computed positions [0, start);
        depth: they draft at most that many tokens per round and only modules 1..depth run for
        them (None: num_speculative_tokens; Request.draft_depth)."""

    def set_depth(self, rows: torch.Tensor, depth: torch.Tensor) -> None:
        """Running requests in `rows` have a lower depth [B] from now on (never a higher one)."""

    def num_final(self, rows: torch.Tensor, num_read_tokens: torch.Tensor) -> torch.Tensor:
        """[B] positions [0, P) whose KV is final in every module of the row's depth, given that x_0 ..
        x_{num_read_tokens - 1} are the tokens the modules read (computed, reading no later
        token); no host sync."""

    def plan(self, cache: ModelCache, rows: torch.Tensor, num_tokens: torch.Tensor,
             target_end: torch.Tensor, is_drafting: torch.Tensor,
             num_columns: int | None = None, num_blocks: int | None = None,
             num_drafts: int | torch.Tensor | None = None,
             num_modules: int | None = None) -> list[ForwardMeta]:
        """The metadata of the round's module forwards, and the bookkeeping it implies.
        num_tokens: known tokens (x_0 .. x_n, n = num_tokens - 1; for a drafting row, every
        verified token); target_end: one past the target's last computed position (rows that do
        not draft, mid-prefill, only catch up to what their inputs allow). num_columns and
        num_blocks (both or neither): static metadata of that many columns, reading that many
        blocks; None: dynamic metadata (a forward with nothing to do is left out). num_drafts:
        drafts this round (an int, or a 0-d tensor inside a compiled graph; None: all
        num_speculative_tokens; a row drafts at most its depth); every module of a row's depth
        still advances over the verified tokens. num_modules: the round runs modules 1..num_modules
        only (an int, at least every row's depth; None: all)."""

    def max_positions(self, num_window_tokens: int, num_drafts: int, num_prev_drafts: int) -> int:
        """Most positions one forward of a decode round's plan covers for a request that verified a
        window of num_window_tokens, drafted num_prev_drafts the round before and drafts
        num_drafts now (host-side, for the static plan's columns)."""

    def draft_loop(self, cache: ModelCache, metas: list[ForwardMeta], rows: torch.Tensor,
                   n: torch.Tensor, target_start: torch.Tensor, target_hidden: torch.Tensor,
                   sampler=None, num_drafts: int | None = None) -> torch.Tensor:
        """Run the planned forwards; -> drafts [B, num_speculative_tokens] int64 (garbage for
        rows that do not draft and beyond num_drafts, the plan's int: no logits are drawn there),
        also written to cache.tokens[rows, n + 1 ..]. sampler: None
        (argmax drafts) or sampler(logits [B, V], draft index) -> tokens [B], an
        mtpx.spec_decode.sampler.DraftSampler (eager only)."""

    def persistent_buffers(self) -> list[torch.Tensor]:
        """Tensors the loop mutates in place across steps (CUDA graphs need fixed addresses)."""
