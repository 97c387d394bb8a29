"""Drafting under the grammar mask: each draft of a constrained request is proposed from draft
logits masked by the grammar state after the tokens before it (docs/structured_output.md,
"Drafting under the mask").

A round of drafting follows a verification (or a prefill's first token) whose emitted tokens the
scheduler has not committed yet (they are read to the host for it). `GrammarDraftSampler` takes each
constrained request's matcher (GrammarMasks, at the committed output), advances it through those
pending tokens, and then, at draft index i, fills the bitmask of the state after drafts
d_1 .. d_i, masks the row's draft logits, lets the wrapped sampler (argmax, or DraftSampler's
sample with q kept) choose d_{i+1}, and advances the matcher through it. Before its next use
the matcher is rolled back to the committed output (GrammarMasks.matcher). So:

- a draft the grammar forbids is never proposed, and where the grammar allows one token only
  (JSON punctuation, a key), that token is the draft;
- at T > 0 with probabilistic drafts, the draft distribution q that verification uses is the
  masked, renormalised one (probabilities from the masked logits), so rejection sampling and
  block verification stay exact (the target's columns are masked too, masks.py);
- unconstrained rows and padding rows are untouched (their logits are not copied). The round
  reads each draft on the host, so a batch with a constrained request drafts eager
  (CompiledStep runs a round with a sampler eager); other batches never build this sampler;
- the mask of draft index i is the grammar state after the pending tokens and d_1 .. d_i, which is
  the target's mask for column i of the next verification window [x, d_1 .. d_k]. Each row keeps
  its round's masks (`DraftMasks`, on its matcher state), with one more after its last draft (the
  window's last column), and GrammarMasks.apply reuses them: each state's mask is filled once.
"""
from __future__ import annotations

import time

import torch

from mtpx.spec_decode.sampler import DraftSampler


class DraftMasks:
    """One row's masks of a draft round, for the next verification window (module doc).

    start: committed output tokens when the round began; pending: the tokens emitted after them
    (committed by the scheduler before the window is verified); drafts: the drafts chosen (each
    accepted by the matcher); masks[i]: the bitmask row [ceil(V / 32)] int32 of the state after
    pending and drafts[:i], rows of the round's bitmask [k + 1, B, W] (a view masks[:n] is
    masks(n))."""
    __slots__ = ("start", "pending", "drafts", "num_masks", "_bitmask", "_b")

    def __init__(self, start: int, pending: list[int]):
        self.start, self.pending, self.drafts, self.num_masks = start, pending, [], 0
        self._bitmask, self._b = None, 0

    def masks(self, n: int) -> torch.Tensor:
        """The first n masks [n, W] int32 (a view)."""
        return self._bitmask[:n, self._b]

    def matches(self, output: list[int]) -> bool:
        """Whether `output` (the committed tokens now) is the round's start plus its pending tokens."""
        return (len(output) == self.start + len(self.pending)
                and output[self.start:] == self.pending)


class _Row:
    __slots__ = ("b", "state", "num_drafts", "live", "saved")

    def __init__(self, b: int, state, num_drafts: int):
        self.b, self.state, self.num_drafts, self.live = b, state, num_drafts, True
        self.saved = None


class GrammarDraftSampler:
    """sampler(logits [B', V], i) -> draft tokens [B'] (DraftBatch.sampler's contract), the rows
    of constrained requests chosen under their grammar mask (module doc).

    masks: the runner's GrammarMasks; reqs: the batch's B requests in row order; pending[b]: the
    tokens row b emitted this step, not yet in its output (host ints); num_drafts[b]: drafts row b
    proposes this round; inner: the sampler it wraps (None: argmax; a DraftSampler: its q is this
    sampler's q). The matchers' advance past the committed output is recorded in their
    num_ahead and rolled back before their next use (GrammarMasks.matcher); host time spent goes
    to masks.draft_seconds."""

    def __init__(self, masks, reqs, pending: list[list[int]], num_drafts: list[int], inner=None):
        self.masks, self.inner, self._bitmask = masks, inner, None
        t0 = time.perf_counter()
        self.rows: list[_Row] = []
        for b, r in enumerate(reqs):
            if r.grammar is None or num_drafts[b] <= 0:
                continue
            state = masks.entry(r)
            m = state.sync()
            if m is None:
                continue
            for t in pending[b]:
                if m.is_terminated() or not m.accept_token(t):
                    break
                state.num_ahead += 1
            row = _Row(b, state, num_drafts[b])
            row.live = state.num_ahead == len(pending[b]) and not m.is_terminated()
            row.saved = state.draft_masks = DraftMasks(state.num_fed, list(pending[b])) if row.live else None
            self.rows.append(row)
        masks.draft_seconds += time.perf_counter() - t0

    @property
    def q(self):
        """The wrapped sampler's draft distributions [B, k, V] (None with argmax drafts)."""
        return getattr(self.inner, "q", None)

    def __call__(self, logits: torch.Tensor, i: int) -> torch.Tensor:
        import xgrammar as xgr
        t0 = time.perf_counter()
        active = [r for r in self.rows if r.live and i < r.num_drafts]
        if active:          # one xgrammar call fills every row's mask (BatchGrammarMatcher)
            rows = [r.b for r in active]
            if self._bitmask is None:       # [k + 1, B, W]: the masks stay for the next window
                k, B = max(r.num_drafts for r in self.rows), logits.shape[0]
                self._bitmask = xgr.allocate_token_bitmask((k + 1) * B, logits.shape[-1]).view(k + 1, B, -1)
            self._fill(active, i)
            logits = logits.float().clone()
            xgr.apply_token_bitmask_inplace(logits, self._bitmask[i].to(logits.device), indices=rows)
        seconds = time.perf_counter() - t0
        tokens = logits.argmax(-1) if self.inner is None else self.inner(logits, i)
        if active:
            t0 = time.perf_counter()
            chosen = tokens.tolist()
            ok = xgr.BatchGrammarMatcher.batch_accept_token([r.state.matcher for r in active],
                                                            [chosen[r.b] for r in active])
            for r, live in zip(active, ok):       # False only with an empty mask
                r.state.num_ahead += live
                if live:
                    r.saved.drafts.append(chosen[r.b])
                r.live = live and not r.state.matcher.is_terminated()
            last = [r for r in active if r.live and i + 1 == r.num_drafts]
            if last:                        # the window's last column: after the row's last draft
                self._fill(last, i + 1)
            seconds += time.perf_counter() - t0
        self.masks.draft_seconds += seconds
        return tokens

    def _fill(self, rows: list[_Row], i: int) -> None:
        """Mask i of each row (the state after its pending tokens and drafts 0 .. i - 1) into the
        round's bitmask, kept on the row's DraftMasks."""
        B, flat = self._bitmask.shape[1], self._bitmask.flatten(0, 1)
        batch_matcher().batch_fill_next_token_bitmask([r.state.matcher for r in rows], flat,
                                                      [i * B + r.b for r in rows])
        self.masks.num_draft_filled += len(rows)
        for r in rows:
            r.saved._bitmask, r.saved._b, r.saved.num_masks = self._bitmask, r.b, i + 1


_BATCH = []


def batch_matcher():
    """xgrammar's BatchGrammarMatcher (one per process), on the calling thread: with 2 threads a
    fill of 2 rows took 342 us against 4 us on one (xgrammar 0.2.9, a loaded 2-core machine)."""
    if not _BATCH:
        import xgrammar as xgr
        _BATCH.append(xgr.BatchGrammarMatcher(max_threads=1))
    return _BATCH[0]


def draft_sampler(sampling, num_drafts: list[int], k: int, config, masks, reqs=(), pending=None):
    """The model runner's draft sampler of a round (DraftBatch.sampler): with probabilistic
    drafts (config.draft_sample_method) and a request at T > 0, a DraftSampler, else None (argmax);
    wrapped in a GrammarDraftSampler when config.structured_outputs_mask_drafts and a request of
    `reqs` is constrained. pending: the tokens each row emitted this step, as {row: first token}
    (a prefill) or (emitted [B, T], accepted [B]) device tensors (a decode: emitted[b, :m + 1]),
    read on the host only for a GrammarDraftSampler. sampling: RequestSampling of the B rows."""
    inner = None
    if config.draft_sample_method == "probabilistic" and not sampling.all_greedy:
        inner = DraftSampler(sampling, num_drafts, k, probabilistic=True)
    if not config.structured_outputs_mask_drafts or all(r.grammar is None for r in reqs):
        return inner
    if isinstance(pending, dict):
        pending = [[pending[b]] if b in pending else [] for b in range(len(reqs))]
    else:
        emitted, accepted = pending
        pending = [e[: m + 1] for e, m in zip(emitted.tolist(), accepted.tolist())]
    return GrammarDraftSampler(masks, reqs, pending, num_drafts, inner)
