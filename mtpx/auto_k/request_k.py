"""Per-request k (scheduler side, no torch): each request's own acceptance estimates, and the
allocation of a ragged step's drafts among its requests (AutoDraftLength.allocate with
EngineConfig.ragged_batch: a step costs its tokens, so each request verifies its own number of
drafts)."""
from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Allocation", "PerRequestK", "RequestEstimates", "allocate", "curve_at", "draw_engine_wide"]


@dataclass(frozen=True)
class Allocation:
    """A ragged step's per-request ks: num_drafts[i] drafts request i verifies; mean_drafts: their
    mean; expected_tokens: the tokens the step is predicted to commit (all requests);
    predicted_ms: its predicted cost of the forwards (0 before the costs are known)."""

    num_drafts: list[int]
    mean_drafts: float
    expected_tokens: float
    predicted_ms: float


class RequestEstimates:
    """Each running request's accepted / verified counts per draft position (undiscounted: a
    request's rounds are few and alike) and its estimates shrunk towards the engine-wide ones.
    Keys are request indices."""

    def __init__(self, max_k: int, prior_weight: float = 4.0, seed: int = 0):
        self.max_k, self.prior_weight = max_k, prior_weight
        self._counts: dict = {}                   # key -> ([accepted], [verified]) per position
        self.rng = random.Random(seed)            # the draws of `sample`

    def __eq__(self, other) -> bool:
        return isinstance(other, RequestEstimates) and (
            (self.max_k, self.prior_weight, self._counts, self.rng.getstate())
            == (other.max_k, other.prior_weight, other._counts, other.rng.getstate()))

    def observe(self, key, num_verified: int, num_accepted: int) -> None:
        """A round of `key` verified drafts 1 .. num_verified (each given the ones before it
        accepted) and accepted the first num_accepted."""
        if num_verified <= 0:
            return
        acc, ver = self._counts.setdefault(key, ([0.0] * self.max_k, [0.0] * self.max_k))
        for j in range(min(num_verified, self.max_k)):
            acc[j] += j < num_accepted
            ver[j] += 1

    def acceptance(self, key, engine_wide: list[float]) -> list[float]:
        """p_j of `key`: (a_j + w q_j) / (v_j + w) with q_j engine_wide[j] and w prior_weight
        pseudo-drafts; engine_wide for a request never observed."""
        counts = self._counts.get(key)
        if counts is None:
            return list(engine_wide)
        w = self.prior_weight
        return [(a + w * q) / (v + w) for a, v, q in zip(*counts, engine_wide)]

    def sample(self, key, engine_wide: list[float]) -> list[float]:
        """A draw of p_j of `key` from Beta(a_j + w q_j, v_j - a_j + w (1 - q_j)), the posterior
        whose mean is `acceptance` (Thompson sampling: a request whose acceptance is uncertain
        sometimes verifies drafts the mean would not give it, so its estimate keeps learning)."""
        acc, ver = self._counts.get(key, ([0.0] * self.max_k, [0.0] * self.max_k))
        w, out = self.prior_weight, []
        for a, v, q in zip(acc, ver, engine_wide):
            q = min(max(q, 1e-3), 1 - 1e-3)
            out.append(self.rng.betavariate(a + w * q, v - a + w * (1 - q)))
        return out

    def forget(self, key) -> None:
        self._counts.pop(key, None)


def draw_engine_wide(accepted: list[float], verified: list[float], prior: float, weight: float,
                     rng) -> list[float]:
    """A draw of the engine-wide p_j from its posterior: Beta(a_j + w m_j, v_j - a_j + w (1 - m_j))
    with a_j, v_j the (discounted) counts of position j, w `weight` pseudo-drafts and m_j the draw
    of position j - 1 (`prior` for position 1), the chain the mean estimates use. Early in a run
    the draws spread widely, so requests sometimes verify drafts the prior alone would not give
    them and the estimates learn; with many rounds seen they tighten (rng: a random.Random)."""
    out, m = [], prior
    for a, v in zip(accepted, verified):
        m = min(max(m, 1e-3), 1 - 1e-3)
        m = rng.betavariate(a + weight * m, max(v - a, 0.0) + weight * (1 - m))
        out.append(m)
    return out


def allocate(held: list[int], acceptance: list[list[float]], cost: Callable[[float], float]) -> Allocation:
    """The drafts each request verifies: held[i] drafts request i holds, acceptance[i] its p_j,
    cost(x) the step's ms when the B requests verify x drafts each on average. Draft j of
    request i adds s_ij = p_i1 ... p_ij expected tokens and one token to the step; the drafts are
    taken in decreasing s_ij (a request's in order, as s_ij falls with j) and the prefix of
    highest predicted goodput, (B + sum of their s_ij) / cost(their number / B), is kept, so
    requests likely to accept draft deep and the rest little or none. predicted_ms is cost(mean)."""
    B = len(held)
    items = []                                    # (s_ij, j, i)
    for i, (n, ps) in enumerate(zip(held, acceptance)):
        survive = 1.0
        for j, p in enumerate(ps[:n], start=1):
            survive *= p
            items.append((survive, j, i))
    items.sort(key=lambda x: (-x[0], x[1], x[2]))
    tokens, best, take = float(B), B / cost(0.0), 0
    for m, (s, _, _) in enumerate(items, start=1):
        tokens += s
        g = tokens / cost(m / B)
        if g > best:
            best, take = g, m
    out = [0] * B
    for _, j, i in items[:take]:
        out[i] = max(out[i], j)
    x = take / B
    return Allocation(out, x, B + sum(it[0] for it in items[:take]), cost(x))


class PerRequestK:
    """Per-request k, an object AutoDraftLength holds (`per_request_k`): each running request's own
    acceptance counts (RequestEstimates), the drafts each request verified per step
    (verified_histogram), and the allocation of a ragged step's drafts. explore: allocate from a
    draw of each request's acceptance (Thompson sampling), else from its estimates."""

    def __init__(self, max_k: int):
        self.max_k, self.explore = max_k, True
        self.reset()

    def __eq__(self, other) -> bool:      # a policy's state compares by value (copies in tests)
        return isinstance(other, PerRequestK) and vars(self) == vars(other)

    def reset(self) -> None:
        """Forget every request's counts and the histogram."""
        self.requests = RequestEstimates(self.max_k)
        self.verified_histogram: Counter = Counter()

    def observe(self, key, num_draft_tokens: int, verified: int, accepted: int) -> None:
        """One round of request `key`: num_draft_tokens verified by the runner, of which drafts
        1 .. verified were verified given every earlier one was accepted, `accepted` accepted."""
        self.verified_histogram[num_draft_tokens] += 1
        self.requests.observe(key, verified, accepted)

    def allocate(self, requests: list[tuple[object, int]], estimates, prior: float, weight: float,
                 cost: Callable[[float, bool], float]) -> Allocation:
        """requests [(key, drafts held, at most max_k)] -> their Allocation (`allocate`) over each
        request's own estimates, or with `explore` a draw: the engine-wide p_j drawn from
        `estimates` (acceptance.AcceptanceEstimates, prior and weight: its prior;
        draw_engine_wide), then each request's; cost(mean drafts, overhead): the ragged step's
        predicted ms, with the step's overhead or without (the allocation's predicted_ms)."""
        held = [n for _, n in requests]
        if self.explore:                 # Thompson: the engine-wide p_j drawn, then each request's
            q = draw_engine_wide(estimates.accepted, estimates.verified, prior, weight, self.requests.rng)
            ps = [self.requests.sample(key, q) for key, _ in requests]
        else:
            ps = [self.requests.acceptance(key, estimates.pooled) for key, _ in requests]
        alloc = allocate(held, ps, lambda x: cost(x, True))
        return Allocation(alloc.num_drafts, alloc.mean_drafts, alloc.expected_tokens,
                          cost(alloc.mean_drafts, False))


def curve_at(curve: list[float], x: float) -> float:
    """curve (ms per integer k) at a mean of x drafts per request: linear between the ks around it."""
    lo = min(int(x), len(curve) - 1)
    hi = min(lo + 1, len(curve) - 1)
    return curve[lo] + (x - lo) * (curve[hi] - curve[lo])
