"""Automatic k's offline goodput model: which k maximises output throughput from a run's
per-position acceptance and the step costs (`predict`, `recommend`; the online goodput is
AutoDraftLength.goodput), and the medians of a run's own pure decode steps (`step_costs`);
smooth_step_costs (the cost curve over k) is re-exported from cost_curve.py.

With B requests decoding, one step verifies a window of k + 1 tokens per request and drafts the
next k, emitting on average tokens_per_round(k) = 1 + sum_{i<k} a_i tokens per request (a_i: the
unconditional acceptance of position i; Leviathan et al. 2023, eq. 1, without their i.i.d.
assumption), so throughput(k, B) = B * tokens_per_round(k) / step_s(k, B), step_s measured
(engine.measure_step_costs, or calibration.calibrate_step_costs). The acceptance comes from a run
with k >= every k predicted; the model ignores prefill time and takes a_i as independent of k
(only approximately true: mtpx.metrics.analytics).
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence

from mtpx.auto_k.cost_curve import smooth_step_costs

__all__ = ["smooth_step_costs", "step_costs", "tokens_per_round", "predict", "recommend"]


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

    costs: `measure_step_costs`'s rows (or any with k, batch_size, step_ms). Returns them with
    "tokens_per_round" and "predicted_throughput"
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
