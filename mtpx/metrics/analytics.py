"""Acceptance analytics from per-round records: why acceptance is what it is.

Every request keeps one ``(num_draft_tokens, num_accepted, num_committed)`` triple per
verification round (`SpecDecodeCounts.rounds`; accepted is the verifier's raw count, committed the
tokens the round appended). From them:

- **Per-position acceptance.** Unconditional: ``[i]`` = rounds whose i-th draft was accepted /
  all rounds (vLLM's definition, `compute_metrics`'s ``per_position_acceptance``). Conditional:
  ``[i]`` = rounds whose i-th draft was accepted / rounds that verified position i, i.e. offered
  more than i drafts and accepted the first i (the chain was unbroken up to i).
- **Position 0 by the previous round.** A round's position-0 outcome, bucketed by the accepted
  count of the same request's previous round: 0 .. k-1 (that round ended in a rejection) or
  "all" (it accepted every draft it offered: the chain never broke). The first round of a request
  has no previous round and is counted apart. This is the multi-module MTP reference design's
  investigation of position 0: it is drafted after every round,
  so its rate depends on how often the previous round ended in a rejection, which depends on k.
- **Prediction across runs.** Run B's position-0 rate predicted from run A's conditional rates and
  run B's mix: share_after_rejection(B) * rate_after_rejection(A) + share_after_full(B) *
  rate_after_full(A) (the reference's 0.771 x 0.704 + 0.229 x 0.857).
- **By category.** Acceptance rate, length and per-position acceptance for each prompt category.

Rates are fractions in [0, 1] (None when their denominator is 0); counts are rounds.
"""
from __future__ import annotations

from collections.abc import Sequence

__all__ = ["per_position", "position0_buckets", "predict_position0", "by_category", "analytics",
           "wilson_interval"]

Rounds = Sequence[tuple[int, int, int]]  # one request's (num_draft_tokens, num_accepted, num_committed)


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval (Wilson 1927) of a rate successes / n, as (low, high) fractions
    (z = 1.96: 95%); None for n = 0. Unlike the normal approximation it stays inside [0, 1] and is
    not empty at 0 or n successes, so it suits the few rounds that reach late draft positions."""
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got {successes} of {n}")
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def per_position(requests: Sequence[Rounds], k: int) -> dict:
    """Unconditional and conditional per-position acceptance over every round of `requests`.

    Returns {"num_rounds", "accepted": [k counts], "reached": [k counts: rounds that verified
    position i], "unconditional": [k rates], "conditional": [k rates]}.

    Raises ValueError when a round accepts more drafts than it offered or offers more than k.
    """
    accepted, reached, n = [0] * k, [0] * k, 0
    for rounds in requests:
        for d, a, *_ in rounds:
            if not 0 <= a <= d <= k:
                raise ValueError(f"round ({d}, {a}): need 0 <= accepted <= drafts <= k={k}")
            n += 1
            for i in range(min(d, a + 1)):      # positions verified: 0..a (or 0..d-1 if all accepted)
                reached[i] += 1
            for i in range(a):
                accepted[i] += 1
    return {"num_rounds": n, "accepted": accepted, "reached": reached,
            "unconditional": [_rate(x, n) for x in accepted],
            "conditional": [_rate(x, r) for x, r in zip(accepted, reached)]}


def position0_buckets(requests: Sequence[Rounds], k: int) -> dict:
    """Position-0 acceptance bucketed by the previous round of the same request (module doc).

    Returns {"rows": [{"prev_accepted": 0 .. k-1 or "all", "count", "accepted", "rate"}, ...],
    "total": {count, accepted, rate} over the bucketed rounds, "first_round": {...} (rounds
    without a previous one), "after_rejection": {...} (rows 0 .. k-1 together), "after_full":
    {...} (row "all"), "share_after_rejection": after_rejection count / total count}.
    """
    counts = {b: [0, 0] for b in [*range(k), "all"]}
    first = [0, 0]
    for rounds in requests:
        prev = None
        for d, a, *_ in rounds:
            cell = first if prev is None else counts["all" if prev[1] == prev[0] else prev[1]]
            cell[0] += 1
            cell[1] += a > 0
            prev = (d, a)

    def stat(c):
        return {"count": c[0], "accepted": c[1], "rate": _rate(c[1], c[0])}

    rej = [sum(counts[b][j] for b in range(k)) for j in (0, 1)]
    total = [rej[0] + counts["all"][0], rej[1] + counts["all"][1]]
    return {"rows": [{"prev_accepted": b, **stat(c)} for b, c in counts.items()],
            "total": stat(total), "first_round": stat(first), "after_rejection": stat(rej),
            "after_full": stat(counts["all"]), "share_after_rejection": _rate(rej[0], total[0])}


def predict_position0(rates_from: dict, mix_from: dict) -> dict:
    """Predict run B's position-0 rate from run A's conditional rates and run B's mix.

    rates_from, mix_from: `position0_buckets` results of runs A and B.
    Returns {"predicted", "measured" (B's total rate), "share_after_rejection",
    "rate_after_rejection", "rate_after_full", "formula" (the arithmetic as text)};
    "predicted" is None when a needed rate is undefined.
    """
    s = mix_from["share_after_rejection"]
    r_rej, r_full = rates_from["after_rejection"]["rate"], rates_from["after_full"]["rate"]
    if s is None or r_rej is None or r_full is None:
        predicted, formula = None, "undefined (a bucket is empty)"
    else:
        predicted = s * r_rej + (1 - s) * r_full
        formula = f"{s:.3f} x {r_rej:.3f} + {1 - s:.3f} x {r_full:.3f} = {predicted:.3f}"
    return {"predicted": predicted, "measured": mix_from["total"]["rate"], "share_after_rejection": s,
            "rate_after_rejection": r_rej, "rate_after_full": r_full, "formula": formula}


def by_category(requests: Sequence[Rounds], categories: Sequence[str], k: int) -> dict:
    """{category: {"num_requests", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
    "num_committed_tokens", "acceptance_rate", "acceptance_length" (committed / num_drafts),
    "per_position_acceptance"}}, categories in first-seen
    order. Raises ValueError when the two sequences differ in length."""
    if len(requests) != len(categories):
        raise ValueError(f"{len(requests)} requests but {len(categories)} categories")
    out: dict[str, dict] = {}
    for cat in dict.fromkeys(categories):
        rs = [r for r, c in zip(requests, categories) if c == cat]
        rounds = [x for r in rs for x in r]
        drafts, acc = sum(r[0] for r in rounds), sum(r[1] for r in rounds)
        committed = sum(r[2] for r in rounds)
        out[cat] = {"num_requests": len(rs), "num_drafts": len(rounds), "num_draft_tokens": drafts,
                    "num_accepted_tokens": acc, "num_committed_tokens": committed,
                    "acceptance_rate": _rate(acc, drafts),
                    "acceptance_length": _rate(committed, len(rounds)),
                    "per_position_acceptance": per_position(rs, k)["unconditional"]}
    return out


def analytics(requests: Sequence[Rounds], categories: Sequence[str], k: int) -> dict:
    """Everything above for one run (metrics.json's "analytics"): {"per_position",
    "position0_buckets", "by_category"}."""
    return {"per_position": per_position(requests, k), "position0_buckets": position0_buckets(requests, k),
            "by_category": by_category(requests, categories, k)}
