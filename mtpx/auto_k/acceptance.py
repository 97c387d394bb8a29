"""Automatic k's acceptance estimates (scheduler side, no torch): the conditional acceptance p_j
of each draft position j, engine-wide and per age of the generation, learned from every
verification round (AutoDraftLength owns one: mtpx/auto_k/policy.py).

Engine-wide (`pooled`): p_j = (accepted_j + w p_{j-1}) / (verified_j + w) from discounted counts,
p_0 = prior_acceptance, w = prior_weight pseudo-drafts; every count is multiplied by `decay` each
decode step (`decay`).

By age: a generation's first rounds accept less than the rest. On GSM8K with the demo at
concurrency 16, p_1 reads 0.58-0.65 over a request's first 8 rounds and 0.77-0.85 after its 12th
(docs/automatic_k.md, "Acceptance by age"). Exploring admits requests at a new depth, so the
drafts it verifies first are young; an estimate learned from them alone undervalues a batch of
mostly older generations. So each round is also counted in its request's age bucket (output
tokens before the round: [0, 8), [8, 16), [16, 32), [32, inf)), estimated from the bucket's own
counts as the engine-wide estimate is from all (a bucket no round reached holds the prior, not the
young rounds' estimate, so exploring goes on until the ages the batch holds are learned). A
batch's E[tokens | k] is the mean of its requests' buckets' (`expected_tokens` with a `mix`),
and a position is unlearned while a bucket the batch holds has fewer than min_verified verified
drafts at it.

Optimism (exploring): a position's upper estimate adds z standard deviations of its Beta
posterior, p + z sqrt(p (1 - p) / (v + w + 1)), capped at 1 (UCB, Auer et al. 2002, with the
posterior's spread in place of their bound).
"""
from __future__ import annotations

import bisect
import math

__all__ = ["AGE_EDGES", "AcceptanceEstimates"]

AGE_EDGES = (8, 16, 32)   # output tokens: the lower edges of the age buckets after [0, 8)


class AcceptanceEstimates:
    """Engine-wide and per-age conditional acceptance (module doc). max_k: draft positions;
    prior_acceptance, prior_weight, decay: as AutoDraftLength's; edges: the age buckets' lower
    edges after the first, in output tokens, increasing."""

    def __init__(self, max_k: int, prior_acceptance: float = 0.7, prior_weight: float = 8.0,
                 decay: float = 0.99, edges: tuple[int, ...] = AGE_EDGES):
        self.max_k, self.prior_acceptance, self.prior_weight = max_k, prior_acceptance, prior_weight
        self.decay_factor, self.edges = decay, tuple(edges)
        self._pooled = [prior_acceptance] * max_k    # p_j, j = 1 .. max_k (`pooled`)
        self.num_observed = [0] * max_k              # verified drafts seen per position (undiscounted)
        self._accepted = [0.0] * max_k               # discounted counts behind p_j (`accepted`)
        self._verified = [0.0] * max_k
        self._age_accepted = [[0.0] * max_k for _ in range(len(self.edges) + 1)]
        self._age_verified = [[0.0] * max_k for _ in range(len(self.edges) + 1)]
        self._pending = 0             # `decay` steps not yet applied to the counts (`_flush`)
        self._age_chains: list[list[float] | None] = [None] * len(self._age_accepted)   # `by_age`
        self._upto: dict = {}         # (k, mix) -> expected_tokens_upto, until the counts change

    def __eq__(self, other) -> bool:
        def state(e):                 # the by-age chains and _upto are caches of the counts
            e._flush()
            return {k: v for k, v in vars(e).items() if k not in ("_age_chains", "_upto")}
        return isinstance(other, AcceptanceEstimates) and state(self) == state(other)

    def _flush(self) -> None:
        """Apply the pending `decay` steps, one multiplication per step as they came (the counts
        equal, bit for bit, those of applying each step at once), and the estimates they change."""
        if not self._pending:
            return
        n, f, self._pending = self._pending, self.decay_factor, 0
        for counts in [self._accepted, self._verified] + self._age_accepted + self._age_verified:
            for j, x in enumerate(counts):
                for _ in range(n if x else 0):      # a zero count stays zero
                    x *= f
                counts[j] = x
        self._estimate()

    def _counts(name: str, doc: str):
        def get(self):
            self._flush()
            return getattr(self, name)

        def put(self, value) -> None:
            self._flush()
            setattr(self, name, value)
        return property(get, put, doc=doc)

    pooled = _counts("_pooled", "p_j, j = 1 .. max_k, engine-wide (read it; `set_pooled` sets it).")
    accepted = _counts("_accepted", "The discounted accepted drafts per position, engine-wide.")
    verified = _counts("_verified", "The discounted verified drafts per position, engine-wide.")
    age_accepted = _counts("_age_accepted", "accepted per age bucket ([bucket][position]).")
    age_verified = _counts("_age_verified", "verified per age bucket ([bucket][position]).")
    del _counts

    def bucket(self, age: int) -> int:
        """The age bucket of a request with `age` output tokens."""
        return bisect.bisect_right(self.edges, age)

    def mix(self, ages) -> list[int] | None:
        """Requests per age bucket of a batch whose requests have `ages` output tokens; None: None."""
        if ages is None:
            return None
        ages = sorted(ages)                  # bucket i: edges[i - 1] <= age < edges[i]
        at = [0] + [bisect.bisect_left(ages, e) for e in self.edges] + [len(ages)]
        counts = [at[i + 1] - at[i] for i in range(len(at) - 1)]
        return counts if any(counts) else None

    def observe(self, num_verified: int, num_accepted: int, age: int | None = None) -> None:
        """A round verified drafts 1 .. num_verified (each given every earlier one accepted) and
        accepted the first num_accepted; age: the request's output tokens before it (None: counted
        engine-wide only)."""
        if num_verified <= 0:
            return
        self._flush()
        b = None if age is None else self.bucket(age)
        for j in range(min(num_verified, self.max_k)):
            hit = j < num_accepted
            self._accepted[j] += hit
            self._verified[j] += 1
            self.num_observed[j] += 1
            if b is not None:
                self._age_accepted[b][j] += hit
                self._age_verified[b][j] += 1
        if num_verified:
            self._estimate()

    def decay(self) -> None:
        """One decode step: every count times `decay` (an estimate no round updates drifts back to
        its prior). O(1): applied when the counts are next read or added to (`_flush`), so a
        stretch of steps that verify nothing costs one increment each."""
        self._pending += 1
        if self._upto:
            self._upto.clear()

    def _estimate(self) -> None:
        self.set_pooled(self._chain(self._accepted, self._verified))
        self._age_chains = [None] * len(self._age_accepted)

    def set_pooled(self, values: list[float]) -> None:
        """Set the engine-wide p_j (tests set them directly through AutoDraftLength.acceptance)."""
        self._flush()
        self._pooled = list(values)
        self._upto.clear()

    def _chain(self, accepted: list[float], verified: list[float]) -> list[float]:
        """p_j = (a_j + w p_{j-1}) / (v_j + w), p_0 = prior_acceptance (module doc)."""
        out, prior, w = [], self.prior_acceptance, self.prior_weight
        for a, v in zip(accepted, verified):
            prior = (a + w * prior) / (v + w)
            out.append(prior)
        return out

    def by_age(self, b: int) -> list[float]:
        """p_bj, j = 1 .. max_k, of age bucket b, from its own counts as `pooled` (module doc);
        computed once per change of the counts (read it, do not change it)."""
        self._flush()
        chains = self._age_chains
        if chains[b] is None:
            chains[b] = self._chain(self._age_accepted[b], self._age_verified[b])
        return chains[b]

    def _tokens(self, ps: list[float], vs: list[float], k: int, optimistic_from: int | None, z: float,
                below: float) -> list[float]:
        """E[tokens | j] for j = 0 .. k (`expected_tokens`)."""
        total, survive, w, out = 1.0, 1.0, self.prior_weight, [1.0]
        for j in range(k):
            p = ps[j]
            if optimistic_from is not None and j >= optimistic_from and vs[j] < below:
                p = min(1.0, max(0.0, p + z * math.sqrt(max(0.0, p * (1 - p)) / (vs[j] + w + 1))))
            survive *= p
            total += survive
            out.append(total)
        return out

    def expected_tokens(self, k: int, mix: list[float] | None = None, optimistic_from: int | None = None,
                        z: float = 0.0, below: float = math.inf) -> float:
        """E[tokens per request step | k]: 1 + sum_{i<=k} prod_{j<=i} p_j, engine-wide (mix None)
        or the mean over a batch's age buckets (mix: requests per bucket, `mix`, or their
        average over steps); positions from
        optimistic_from on (0-based) with fewer than `below` verified drafts at their upper
        estimate with z standard deviations (z < 0: their lower estimate)."""
        return self.expected_tokens_upto(k, mix, optimistic_from, z, below)[k]

    def expected_tokens_upto(self, k: int, mix: list[float] | None = None, optimistic_from: int | None = None,
                             z: float = 0.0, below: float = math.inf) -> list[float]:
        """[expected_tokens(j, ...) for j = 0 .. k], in one pass over the positions; without
        optimism, computed once per change of the counts (the list is shared: read it)."""
        if k == 0:
            return [1.0]               # no position read: the counts need no pending decay (`_flush`)
        key = None if optimistic_from is not None else (k, None if mix is None else tuple(mix))
        if key in self._upto:
            return self._upto[key]
        self._flush()
        if mix is None:
            out = self._tokens(self._pooled, self._verified, k, optimistic_from, z, below)
        else:
            total, weight = [0.0] * (k + 1), sum(mix)
            for b, n in enumerate(mix):
                if n:
                    tokens = self._tokens(self.by_age(b), self._age_verified[b], k, optimistic_from, z, below)
                    for j, t in enumerate(tokens):
                        total[j] += n * t
            out = [t / weight for t in total]
        if key is not None:
            self._upto[key] = out
        return out

    def unlearned(self, j: int, min_verified: float, mix: list[float] | None = None) -> bool:
        """Whether position j + 1 has fewer than min_verified discounted verified drafts:
        engine-wide (mix None), else in one of the age buckets that hold at least 5% of mix."""
        if j >= self.max_k:
            return False
        if mix is None:
            return self.verified[j] < min_verified
        least = 0.05 * sum(mix)
        return any(n > 0 and n >= least and self.age_verified[b][j] < min_verified for b, n in enumerate(mix))

    def summary(self) -> list[dict]:
        """metrics.json's auto_k.acceptance_by_age: per bucket its output-token range, p_bj and
        discounted verified drafts."""
        lows = (0,) + self.edges
        highs = self.edges + (None,)
        return [{"output_tokens": f"{lo}-{hi - 1}" if hi else f"{lo}+",
                 "conditional_acceptance": [round(p, 4) for p in self.by_age(b)],
                 "verified": [round(v, 2) for v in self.age_verified[b]]}
                for b, (lo, hi) in enumerate(zip(lows, highs))]
