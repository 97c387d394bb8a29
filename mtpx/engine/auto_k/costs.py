"""Step costs of automatic k: measure the engine's decode step (`calibrate_step_costs`, at
start-up), fit the cost curve over k (`smooth_step_costs`, re-exported from the scheduler side's
mtpx.core.draft_length: a running median, then non-decreasing), and goodput (`predict`, `recommend`: which k maximises output throughput from a
run's per-position acceptance, offline; the online goodput is AutoDraftLength.goodput).

At steady state with B requests decoding, one engine step verifies a window of k+1 tokens per
request and drafts the next k, and emits on average

    tokens_per_round(k) = 1 + sum_{i<k} a_i

tokens per request, where a_i is the unconditional per-position acceptance (rounds whose i-th
draft was accepted / rounds: the expected number of accepted drafts is their sum; Leviathan et al.
2023, eq. 1, without their i.i.d. assumption). So

    throughput(k, B) = B * tokens_per_round(k) / (verify_s(k, B) + draft_s(k, B))

with verify_s and draft_s the measured step costs (`mtpx.engine.engine.StepTiming`):
`measure_step_costs` times the engine's decode step at each (k, B) (calibrate_step_costs: no
prefill, the ks alternated call by call), and `step_costs` takes the medians of a run's own pure
decode steps. The acceptance a_i comes from a run with k >= every k predicted (positions beyond a run's k are unknown). The model ignores prefill time and assumes a_i
does not depend on k, which the position-0 analytics (mtpx.metrics.analytics) show is only
approximately true: position 0 is drafted after every round, and a longer k changes how often the
previous round ended in a rejection.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

from mtpx.core.draft_length import smooth_step_costs
from mtpx.core.request import Request
from mtpx.core.sampling_params import SamplingParams
from mtpx.engine.decode_step import depth_bucket
from mtpx.engine.warmup import forced_dummy_requests

__all__ = ["calibrate_step_costs", "calibrate_prefill_cost", "default_batch_sizes", "smooth_step_costs", "measure_step_costs",
           "step_costs", "tokens_per_round", "predict", "recommend"]


def default_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 4, 16, 64, ... below max_num_seqs, and max_num_seqs."""
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 4
    return sizes + [max_num_seqs]


def calibrate_step_costs(engine, batch_sizes=None, rounds: int = 8, context_len: int = 192, seed: int = 0,
                         draft_costs: dict | None = None, passes: int = 3, spread_s: float = 10.0,
                         max_passes: int = 24) -> dict:
    """Measure the engine's own decode step at every k in 0..max_k and batch size B
    (Engine.time_decode_steps): B requests at context_len known tokens verify and propose k
    drafts (each of depth k with per-request depth: the step of a k-module engine), the ks
    alternated call by call over `rounds` rounds after one untimed round; a pass's cost of a k is
    the median of its rounds, and a k's cost the least of `passes` passes, each over every batch
    size in turn. No request is prefilled: the positions before the window are taken as
    computed, as vLLM's dummy runs profile a step, since values do not change its cost. That makes
    the calibration cheap (at max_num_seqs 64 the fresh requests' prefill was 87% of 143 s:
    experiments/auto_k/main_job) and puts every k at the same context length; alternating the ks
    call by call makes a burst of load from another process slow every k alike, where on 2 CPU
    cores one k's steps measured in one stretch read up to 30% off the same k a minute later
    (experiments/auto_k). Load only slows a step, in stretches of seconds that can cover a whole
    batch-1 pass (2 s): the least of passes spread over the calibration keeps a quiet one
    (experiments/step_costs/calibration_passes), and passes go on (at most max_passes) until the
    steps they timed add up to spread_s seconds: three batch-1 passes took 4.5 s, and one noisy
    stretch put k = 7 and 8 at 1.23x k = 6 where later calibrations read 1.06x, which kept eager
    concurrency 1 at depth 6 (experiments/concurrency/settled). context_len: the middle of the main
    job's decode steps (prompts of about 128 tokens, up to 128 output tokens). A compiled engine
    times only its depth buckets (decode_step.depth_bucket), each k costing its bucket's step.
    The engine must be idle, and is afterwards. Returns {(k, B): ms}; draft_costs (when given)
    gets the same steps' draft rounds, {(k, B): ms} (the least of the passes' medians): what a
    step below a held depth still pays (AutoDraftLength.draft_cost). Raises ValueError when the
    engine has no automatic k or is busy."""
    policy = engine.draft_length
    if not getattr(policy, "auto", False):
        raise ValueError("calibration needs num_speculative_tokens=auto")
    if engine.has_unfinished_requests():
        raise ValueError("calibrate the step costs before adding requests")
    sizes = default_batch_sizes(engine.config.max_num_seqs) if batch_sizes is None else sorted(set(batch_sizes))
    # a compiled step pads a k to its depth bucket, so a bucket's cost is each of its ks'
    bucket = {k: k for k in range(policy.max_k + 1)}
    if engine.compiled is not None:
        bucket = {k: depth_bucket(k, policy.max_k, engine.config.compile_depths) for k in bucket}
    tops = sorted(set(bucket.values()))
    step: dict = {}
    draft_step: dict = {}
    done = spent_ms = 0
    while done < max(1, passes) or spent_ms < 1e3 * spread_s and done < max_passes:
        done += 1
        for b in sizes:
            draft: dict = {}
            times = engine.time_decode_steps(b, tops, context_len, rounds, seed=seed, draft=draft)
            spent_ms += sum(sum(ts) for ts in times.values())
            for top in tops:
                step[(top, b)] = min(step.get((top, b), math.inf), statistics.median(times[top]))
                draft_step[(top, b)] = min(draft_step.get((top, b), math.inf), statistics.median(draft[top]))
    costs = {(k, b): step[(top, b)] for b in sizes for k, top in bucket.items()}
    if draft_costs is not None:
        draft_costs.update({(k, b): draft_step[(top, b)] for b in sizes for k, top in bucket.items()})
    return costs


def calibrate_prefill_cost(engine, prompt_len: int = 128, rounds: int = 3, seed: int = 0) -> float | None:
    """Measure the speculator's part of a prefill (StepTiming.prefill_draft_s: its draft modules
    over the prompt, then the first drafts) in ms per prompt token and module: `rounds` requests of
    prompt_len random tokens (lowered to what the model length and KV pool allow), each prefilled
    alone at depth max_k, the median of their values. The engine's own prefill path, eager as in
    every run, at the main job's prompt length: a prompt of a few tokens reads dearer per token (the
    first drafts weigh more). Automatic k's policy forgets the dummy requests afterwards
    (AutoDraftLength.reset). Returns None without step timings or room for a prompt. Raises
    ValueError when the engine is busy or has no automatic k."""
    policy, c = engine.draft_length, engine.config
    if not getattr(policy, "auto", False):
        raise ValueError("calibration needs num_speculative_tokens=auto")
    if engine.has_unfinished_requests():
        raise ValueError("calibrate the prefill cost before adding requests")
    k = policy.max_k
    length = min(prompt_len, c.max_model_len - 2, c.num_blocks * c.block_size - 2 * k - 3)
    if length < 1 or not c.record_step_timings:
        return None
    g = torch.Generator().manual_seed(seed)
    vocab = engine.model.cfg.vocab_size
    values = []
    try:
        with forced_dummy_requests(engine, k):
            for i in range(rounds):
                engine.add_request(Request(i, torch.randint(2, vocab, (length,), generator=g).tolist(),
                                           SamplingParams(max_tokens=1, ignore_eos=True)))
                while engine.has_unfinished_requests():
                    engine.step()
                    t = engine.step_timings[-1] if engine.step_timings else None
                    if t is not None and t.num_prefill_module_tokens:
                        values.append(1e3 * t.prefill_draft_s / t.num_prefill_module_tokens)
    finally:
        policy.reset()
    return statistics.median(values) if values else None


def measure_step_costs(model, spec: str, batch_sizes, num_speculative_tokens: int | None = None,
                       rounds: int = 8, context_len: int = 192, **engine_kwargs) -> list[dict]:
    """The start-up calibration of automatic k (calibrate_step_costs) on a fresh engine over
    `model` (an MTPForCausalLM) with speculator `spec` ("mtp1" | "mtp8") drafting up to
    num_speculative_tokens (None: the speculator's default), as offline tools use it. Returns
    [{"k", "batch_size", "step_ms"}] for every k in 0 .. that many and each batch size, sorted,
    step_ms the raw median (not smoothed). Raises ValueError as calibrate_step_costs does."""
    from mtpx.core.draft_length import AutoDraftLength
    from mtpx.engine.engine import Engine
    from mtpx.spec_decode import build_speculator

    sizes = sorted(set(batch_sizes))
    speculator = build_speculator(spec, model, num_speculative_tokens)
    engine = Engine(model, speculator, max_num_seqs=max(sizes), draft_length=AutoDraftLength(
        speculator.num_speculative_tokens), **engine_kwargs)
    costs = calibrate_step_costs(engine, sizes, rounds=rounds, context_len=context_len)
    return [{"k": k, "batch_size": b, "step_ms": ms} for (k, b), ms in sorted(costs.items())]


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

    costs: `measure_step_costs`'s rows (or any with k, batch_size, step_ms). Returns them with "tokens_per_round" and "predicted_throughput"
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
