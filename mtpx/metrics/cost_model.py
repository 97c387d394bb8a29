"""Cost model: which num_speculative_tokens (k) maximises output throughput.

At steady state with B requests decoding, one engine step verifies a window of k+1 tokens per
request and drafts the next k, and emits on average

    tokens_per_round(k) = 1 + sum_{i<k} a_i

tokens per request, where a_i is the unconditional per-position acceptance (rounds whose i-th
draft was accepted / rounds: the expected number of accepted drafts is their sum; Leviathan et al.
2023, eq. 1, without their i.i.d. assumption). So

    throughput(k, B) = B * tokens_per_round(k) / (verify_s(k, B) + draft_s(k, B))

with verify_s and draft_s the measured step costs (`mtpx.engine.engine.StepTiming`): `mtpx.engine.calibration.calibrate`
runs the engine at each (k, B) on synthetic prompts and takes the median over steps where every
request decodes with a full k drafts. The acceptance a_i comes from a run with k >= every k
predicted (positions beyond a run's k are unknown). The model ignores prefill time and assumes a_i
does not depend on k, which the position-0 analytics (mtpx.metrics.analytics) show is only
approximately true: position 0 is drafted after every round, and a longer k changes how often the
previous round ended in a rejection.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["step_costs", "tokens_per_round", "predict", "recommend"]


def step_costs(timings, k: int) -> dict[int, dict]:
    """Median verify/draft cost of pure decode steps with a full k drafts per request, by batch.

    timings: `StepTiming`s of one engine run with num_speculative_tokens = k.
    Returns {batch size B: {"verify_ms", "draft_ms", "step_ms", "steps"}} over steps without
    prefill tokens whose every request verified k drafts; each is a median over those steps
    (step_ms is the median of verify + draft per step, not the sum of the two medians).
    """
    by_batch: dict[int, list] = {}
    for t in timings:
        if t.num_decodes and not t.num_prefill_tokens and t.num_draft_tokens == k * t.num_decodes:
            by_batch.setdefault(t.num_decodes, []).append(t)
    return {b: {"verify_ms": 1e3 * statistics.median(t.verify_s for t in ts),
                "draft_ms": 1e3 * statistics.median(t.draft_s for t in ts),
                "step_ms": 1e3 * statistics.median(t.verify_s + t.draft_s for t in ts),
                "steps": len(ts)}
            for b, ts in sorted(by_batch.items())}


def tokens_per_round(per_position_acceptance: Sequence[float], k: int) -> float:
    """1 + sum of the first k per-position acceptance rates (module doc). Raises ValueError when
    k exceeds the positions measured."""
    if k > len(per_position_acceptance):
        raise ValueError(f"k={k} but acceptance was measured for {len(per_position_acceptance)} positions: "
                         "use a run with num_speculative_tokens >= k")
    return 1.0 + sum(per_position_acceptance[:k])


def predict(per_position_acceptance: Sequence[float], costs: Sequence[dict]) -> list[dict]:
    """Predicted output throughput (tokens/s) for every calibrated (k, B) (module doc).

    costs: `mtpx.engine.calibration.calibrate`'s rows. Returns them with "tokens_per_round" and "predicted_throughput"
    added (rows with k beyond the measured positions are left out)."""
    out = []
    for c in costs:
        if c["k"] > len(per_position_acceptance):
            continue
        tpr = tokens_per_round(per_position_acceptance, c["k"])
        out.append({**c, "tokens_per_round": tpr,
                    "predicted_throughput": c["batch_size"] * tpr / (c["step_ms"] / 1e3)})
    return out


def recommend(predictions: Sequence[dict]) -> dict[int, int]:
    """{batch size: the k with the highest predicted throughput}."""
    best: dict[int, dict] = {}
    for p in predictions:
        b = p["batch_size"]
        if b not in best or p["predicted_throughput"] > best[b]["predicted_throughput"]:
            best[b] = p
    return {b: p["k"] for b, p in sorted(best.items())}
