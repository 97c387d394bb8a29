"""Sampling at temperature > 0: logits to probabilities with each request's temperature, top-k,
top-p and min-p (applied in that order, to the target and the draft alike), and inverse-CDF
sampling from one uniform per token drawn from the request's own generator, so that a seeded
request emits the same tokens whatever else shares its batch.

Greedy requests (temperature 0) get the one-hot distribution of the argmax: token-level and block
verification then reduce exactly to greedy verification.
"""
from __future__ import annotations

import torch


def probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                      top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """logits [N, V]; temperature, top_p, min_p [N] float; top_k [N] int64 (<= 0: all tokens)
    -> probabilities [N, V] in float64. top_k keeps ties with the k-th logit; top_p keeps the
    smallest prefix of the sorted distribution whose mass reaches top_p (at least one token);
    min_p drops tokens below min_p x the largest probability."""
    x = logits.double()
    N, V = x.shape
    greedy = temperature == 0
    x = x / torch.where(greedy, 1.0, temperature.double())[:, None]
    k = torch.where(top_k > 0, top_k, V).clamp(max=V)
    kth = x.sort(-1, descending=True).values.gather(1, (k - 1)[:, None])
    x = x.masked_fill(x < kth, float("-inf"))
    probs = x.softmax(-1)
    sorted_p, order = probs.sort(-1, descending=True)
    keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < top_p.double()[:, None]
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    probs = probs * keep
    probs = probs * (probs >= min_p.double()[:, None] * probs.max(-1, keepdim=True).values)
    probs = probs / probs.sum(-1, keepdim=True)
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), V).double()
    return torch.where(greedy[:, None], one_hot, probs)


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [N, V], u [N] uniforms in [0, 1) -> tokens [N] int64 (the first
    token whose cumulative probability exceeds u; zero-probability tokens are never chosen)."""
    cdf = probs.cumsum(-1)
    idx = torch.searchsorted(cdf, (u.to(cdf.dtype) * cdf[:, -1])[:, None], right=True)[:, 0]
    return idx.clamp(max=probs.shape[-1] - 1)


class RequestSampling:
    """The sampling state of a batch of requests: per-row parameter tensors and generators.

    params: SamplingParams per row; generators: torch.Generator per row (None for greedy rows).
    uniforms(n, rows) draws n uniforms for each listed row from its own generator, in row order
    -> [len(rows), n] float64 (0.5 for greedy rows, which never need them)."""

    def __init__(self, params, generators, device):
        self.greedy = torch.tensor([p.greedy for p in params], device=device)
        self.temperature = torch.tensor([p.temperature for p in params], device=device,
                                        dtype=torch.float64)
        self.top_k = torch.tensor([p.top_k for p in params], device=device)
        self.top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float64)
        self.min_p = torch.tensor([p.min_p for p in params], device=device, dtype=torch.float64)
        self.generators = generators
        self.device = device
        self.all_greedy = all(p.greedy for p in params)   # from the host params: no device sync

    def probs(self, logits: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """logits [N, V] or [N, T, V] of batch rows `rows` (default all) -> probabilities."""
        idx = slice(None) if rows is None else rows
        shape = logits.shape
        if logits.dim() == 3:
            rep = lambda t: t[idx].repeat_interleave(shape[1])  # noqa: E731
            out = probs_from_logits(logits.reshape(-1, shape[-1]), rep(self.temperature),
                                    rep(self.top_k), rep(self.top_p), rep(self.min_p))
            return out.view(shape)
        return probs_from_logits(logits, self.temperature[idx], self.top_k[idx], self.top_p[idx],
                                 self.min_p[idx])

    def uniforms(self, counts: list[int], width: int | None = None) -> torch.Tensor:
        """counts[b] uniforms for row b from its own generator -> [B, width] float64, padded
        (and filled for greedy rows) with 0.5. Drawing exactly what a row uses keeps a seeded
        request's stream independent of the other rows."""
        width = max(counts, default=0) if width is None else width
        out = torch.full((len(counts), width), 0.5, dtype=torch.float64)
        for b, n in enumerate(counts):
            g = self.generators[b]
            if g is not None and n > 0:
                out[b, :n] = torch.rand(n, generator=g, dtype=torch.float64)
        return out.to(self.device)


class DraftSampler:
    """What a speculator calls to turn draft logits into draft tokens, draft by draft:
    sampler(logits [B', V], draft index i) -> tokens [B'], rows in batch order; the first B rows
    are the requests of `sampling` (B' - B padding rows after them get the argmax).

    greedy drafts (draft_sample_method="greedy", vLLM's default): the argmax, whose draft
    distribution q is one-hot. probabilistic: a sample from the draft distribution processed with
    the request's own temperature/top-k/top-p/min-p, q kept in `q` [B, k, V] for verification.
    num_drafts[b]: the drafts row b proposes (0 mid-prefill); row b draws one uniform for each
    draft index i < num_drafts[b] and none for the later ones the step computes for deeper rows,
    so its generator advances the same whatever the rest of the batch."""

    def __init__(self, sampling: RequestSampling, num_drafts: list[int], k: int, probabilistic: bool):
        self.sampling, self.probabilistic, self.num_speculative_tokens = sampling, probabilistic, k
        self.num_drafts = list(num_drafts)
        self.q: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor, i: int) -> torch.Tensor:
        if not self.probabilistic:
            return logits.argmax(-1)
        B = len(self.num_drafts)
        probs = self.sampling.probs(logits[:B])
        if self.q is None:
            self.q = torch.zeros(B, self.num_speculative_tokens, logits.shape[-1], dtype=probs.dtype,
                                 device=probs.device)
        self.q[:, i] = probs
        counts = [1 if i < n else 0 for n in self.num_drafts]
        tokens = sample(probs, self.sampling.uniforms(counts, 1)[:, 0])
        return torch.cat([tokens, logits[B:].argmax(-1)])
