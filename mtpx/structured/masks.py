"""The model runner's grammar matchers: each constrained request's xgrammar GrammarMatcher and the
token masks it puts on the target's logits, exact under speculation.

A matcher is worker-side state of one request, created from `Request.grammar` on its first use
and dropped once the request has finished (finish or abort, at the next masking). Before each use
it is brought up to the request's committed output (`Request.output_token_ids`, the scheduler's):
a request resumed after preemption keeps its output, so its matcher stays valid, and tokens cut at
a stop string or max_tokens are never fed. So between steps a matcher is exactly at the committed
tokens.

Verification window [x_n, d_1 .. d_k] (docs/structured_output.md, "Exact under speculation"):
column j holds the target's logits for output token len(output) + j, which follows d_1 .. d_j.
Column j is masked with the grammar state after d_1 .. d_j: the matcher fills column 0's mask,
accepts d_1, fills column 1's, and so on; a draft the grammar forbids ends the walk (the target's
masked column gives it probability 0, so every verifier rejects it and no later column is read),
and the matcher is rolled back over the drafts it accepted. The target's distribution at every
column is thus the constrained distribution plain decoding samples from, and greedy output equals
plain decoding's under the same constraint (tests/test_structured_output.py).
"""
from __future__ import annotations

import time

import torch

from mtpx.structured.drafts import batch_matcher


class _Matcher:
    def __init__(self, request):
        import xgrammar as xgr
        self.request = request
        self.matcher = xgr.GrammarMatcher(request.grammar)
        self.num_fed = 0              # output tokens accepted so far
        self.broken = False           # a committed token the grammar rejects: no more masking
        self.num_ahead = 0            # tokens accepted past them by a draft round (drafts.py)
        self.draft_masks = None       # the last draft round's masks (drafts.DraftMasks), used once

    def sync(self):
        out = self.request.output_token_ids
        saved = self.draft_masks
        if (saved is not None and self.num_fed == saved.start and saved.matches(out)
                and self.num_ahead == len(saved.pending) + len(saved.drafts)):
            self.num_ahead, self.num_fed = len(saved.drafts), len(out)     # its pending tokens are out
        if self.num_ahead:
            self.matcher.rollback(self.num_ahead)
            self.num_ahead = 0
        while not self.broken and self.num_fed < len(out):
            if self.matcher.is_terminated() or not self.matcher.accept_token(out[self.num_fed]):
                self.broken = True
            self.num_fed += 1
        return None if self.broken else self.matcher


class GrammarMasks:
    """Grammar matchers by request index, and the masking of their logits.

    apply(reqs, logits, raw, drafts): logits [B, V] (each request's next token) or [B, T, V]
    (verification windows), already processed (mtpx/engine/logits.py); raw: the unprocessed
    logits of the same shape; drafts: per row the window's draft ids (host ints, [] for none).
    Returns float32 logits with every token the grammar forbids at -inf (a copy; `logits` itself
    when no request is constrained). A column left with no token (the grammar and min_tokens,
    allowed_token_ids or bad_words exclude each other) takes the grammar-masked raw logits.
    seconds / num_masked: host time spent and columns masked (the mask's cost); draft_seconds:
    host time spent masking draft logits (mtpx/structured/drafts.py). Column j reuses the draft
    round's mask of draft index j when the window's committed output and drafts d_1 .. d_j are the
    round's (drafts.DraftMasks): num_filled counts the columns filled here, num_reused those reused
    (num_filled + num_reused == num_masked), num_draft_filled the draft round's fills."""

    def __init__(self):
        self._matchers: dict[int, _Matcher] = {}
        self.seconds = 0.0
        self.draft_seconds = 0.0
        self.num_masked = 0
        self.num_filled = 0
        self.num_reused = 0
        self.num_draft_filled = 0

    def matcher(self, request):
        """The request's xgrammar GrammarMatcher at its committed output (None once a committed
        token broke it)."""
        return self.entry(request).sync()

    def entry(self, request) -> _Matcher:
        """The request's matcher state (made on first use), not yet synced."""
        m = self._matchers.get(request.index)
        if m is None or m.request is not request:
            m = self._matchers[request.index] = _Matcher(request)
        return m

    def _saved(self, request, window: list[int], width: int) -> torch.Tensor | None:
        """The draft round's masks [n, W] of the request's window columns 0 .. n - 1 that hold
        here (None for none): the committed output is the round's, and column j's drafts
        d_1 .. d_j are the round's (all columns when the window's drafts are the round's own).
        The round's masks are used once."""
        entry = self._matchers[request.index]
        saved, entry.draft_masks = entry.draft_masks, None
        if saved is None or not saved.num_masks or saved.masks(1).shape[-1] != width \
                or not saved.matches(request.output_token_ids):
            return None
        n = 1                                # column n holds after d_1 .. d_n, the round's
        while n < saved.num_masks and n <= len(window) and window[n - 1] == saved.drafts[n - 1]:
            n += 1
        return saved.masks(n)

    def apply(self, reqs, logits: torch.Tensor, raw: torch.Tensor, drafts: list[list[int]] | None = None):
        rows = [b for b, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return logits
        import xgrammar as xgr                       # loads with the first constrained request
        t0 = time.perf_counter()
        for index in [i for i, m in self._matchers.items() if m.request.finished]:
            del self._matchers[index]                # finished or aborted
        T, V = (logits.shape[1] if logits.dim() == 3 else 1), logits.shape[-1]
        bitmask = xgr.allocate_token_bitmask(len(reqs) * T, V)           # all allowed
        masked = []                                                      # flat rows masked
        matchers = {b: m for b in rows if (m := self.matcher(reqs[b])) is not None}
        walking = [(b, m, drafts[b] if drafts is not None else []) for b, m in matchers.items()]
        saved = {b: self._saved(reqs[b], window, bitmask.shape[-1]) for b, _, window in walking}
        by_row = bitmask.view(len(reqs), T, -1)
        for b, _, window in walking:         # the draft round's masks of every column: no walk
            if saved[b] is not None and len(saved[b]) == len(window) + 1:
                by_row[b, : len(window) + 1] = saved[b]
                masked += range(b * T, b * T + len(window) + 1)
                self.num_reused += len(window) + 1
        walking = [w for w in walking if saved[w[0]] is None or len(saved[w[0]]) <= len(w[2])]
        saved = {b: [] if m is None else m for b, m in saved.items()}
        advanced = dict.fromkeys(range(len(reqs)), 0)
        for j in range(T):                   # column j of every walking row in one xgrammar call
            walking = [w for w in walking if not w[1].is_terminated()]
            if not walking:
                break
            reuse = [b for b, _, _ in walking if j < len(saved[b])]
            for b in reuse:                  # the draft round's mask of this state (drafts.py)
                bitmask[b * T + j] = saved[b][j]
            fill = [w for w in walking if j >= len(saved[w[0]])]
            if fill:
                batch_matcher().batch_fill_next_token_bitmask([m for _, m, _ in fill], bitmask,
                                                              [b * T + j for b, _, _ in fill])
            masked += [b * T + j for b, _, _ in walking]
            self.num_filled, self.num_reused = self.num_filled + len(fill), self.num_reused + len(reuse)
            walking = [w for w in walking if j < len(w[2])]       # no draft: the window ends
            ok = xgr.BatchGrammarMatcher.batch_accept_token([m for _, m, _ in walking],
                                                            [window[j] for _, _, window in walking])
            walking = [w for w, a in zip(walking, ok) if a]      # a forbidden draft ends it too
            for b, _, _ in walking:
                advanced[b] += 1
        for b, m in matchers.items():
            if advanced[b]:
                m.rollback(advanced[b])
        bitmask = bitmask.to(logits.device)
        out = logits.float().clone().view(-1, V)
        if masked:                                    # only the masked columns are read
            xgr.apply_token_bitmask_inplace(out, bitmask, indices=masked)
        if any(reqs[b].params.min_tokens or reqs[b].params.allowed_token_ids or reqs[b].bad_words_token_ids
               for b in rows):
            idx = torch.tensor(masked, dtype=torch.long, device=out.device)
            dead = idx[torch.isneginf(out[idx]).all(-1)]
            if len(dead):
                fallback = raw.float().reshape(-1, V)[dead].clone()
                xgr.apply_token_bitmask_inplace(fallback, bitmask[dead])
                out[dead] = fallback
        self.seconds += time.perf_counter() - t0
        self.num_masked += len(masked)
        return out.view(logits.shape)
