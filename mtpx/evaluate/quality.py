"""Quality beside speed for a lossy acceptance rule (spec.acceptance other than lossless;
docs/acceptance_rules.md): mode=eval decodes the prompts again with the same speculator and the
lossless rule (the reference, as the lossless check does with plain decoding) and adds to
metrics.json a "quality" record:

- identical_share: requests whose tokens equal the reference's; mean_first_difference: the mean
  output position of the first differing token over the requests that differ.
- log_likelihood, log_likelihood_lossless: the target's mean log-probability per output token (at
  temperature 1, raw logits: a prefill of prompt + output with prompt_logprobs) of the rule's text
  and of the reference's; log_likelihood_loss = reference - rule, with a 95% interval from the
  per-request differences (normal approximation).
- accuracy, accuracy_lossless (GSM8K answers) with Wilson 95% intervals; accuracy_loss with the
  paired interval.
- at temperature > 0, tv_distance: on the first eval.tv_num_prompts prompts, eval.tv_num_samples
  seeded samples (independent seeds) of eval.tv_max_tokens tokens each from the rule and from the
  reference, the total
  variation between the empirical distributions of the token at each position, averaged over
  prompts and positions; tv_distance_floor: the same between two independent sample sets of the
  reference (the estimate's own noise); tv_distance_loss = tv_distance - floor.

`eval.max_quality_loss` ({metric: bound}) makes the run exit 1 with one line when a loss exceeds
its bound (`gate`).
"""
from __future__ import annotations

import math
from collections import Counter

from mtpx.core.sampling_params import SamplingParams
from mtpx.data.gsm8k import extract_predicted_answer, score
from mtpx.schema.groups import QUALITY_GATE_METRICS

Z95 = 1.959963984540054
GATE_METRICS = {"differing_share": "differing_share", "log_likelihood": "log_likelihood_loss",
                "accuracy": "accuracy_loss", "tv_distance": "tv_distance_loss"}
"""eval.max_quality_loss's keys (QUALITY_GATE_METRICS, checked by the eval group) -> the quality
record's loss: 1 - identical_share, the log-likelihood per token lost (nats), the accuracy lost,
the excess TV distance."""
assert set(GATE_METRICS) == set(QUALITY_GATE_METRICS)


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of k successes in n trials (Wilson 1927); None for n = 0."""
    if n == 0:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: list[float], z: float = Z95) -> tuple[float, float, float] | None:
    """(mean, low, high): the mean with its normal-approximation interval, z x sample std / sqrt(n);
    None without values (a single value has a zero-width interval)."""
    n = len(values)
    if n == 0:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, mean - z * sd / math.sqrt(n), mean + z * sd / math.sqrt(n)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first output position where a and b differ (the shorter length when one is a prefix of
    the other), None when they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def tv_distance(samples_a: list[list[int]], samples_b: list[list[int]], length: int) -> float:
    """Mean over positions t < length of the total variation between the empirical distributions of
    token t in samples_a and in samples_b (sequences shorter than t + 1 count as an end symbol)."""
    total = 0.0
    for t in range(length):
        ca = Counter(s[t] if t < len(s) else None for s in samples_a)
        cb = Counter(s[t] if t < len(s) else None for s in samples_b)
        total += 0.5 * sum(abs(ca[v] / len(samples_a) - cb[v] / len(samples_b)) for v in set(ca) | set(cb))
    return total / length


def token_quality(rule: list[list[int]], reference: list[list[int]], ll_rule: list[list[float]],
                  ll_ref: list[list[float]], correct_rule: list[bool] | None = None,
                  correct_ref: list[bool] | None = None) -> dict:
    """The quality record's token, log-likelihood and accuracy entries (module doc) from each
    request's output tokens, per-token log-probabilities and (where the set has answers) correctness."""
    diffs = [first_difference(a, b) for a, b in zip(rule, reference)]
    differing = [d for d in diffs if d is not None]
    n = len(rule)
    out = {"num_requests": n, "identical_share": (n - len(differing)) / n if n else None,
           "differing_share": len(differing) / n if n else None,
           "mean_first_difference": sum(differing) / len(differing) if differing else None}
    tokens_rule, tokens_ref = sum(map(len, ll_rule)), sum(map(len, ll_ref))
    out["log_likelihood"] = sum(map(sum, ll_rule)) / tokens_rule if tokens_rule else None
    out["log_likelihood_lossless"] = sum(map(sum, ll_ref)) / tokens_ref if tokens_ref else None
    per_request = [sum(b) / len(b) - sum(a) / len(a) for a, b in zip(ll_rule, ll_ref) if a and b]
    ll = mean_interval(per_request)
    ll_rule_mean, ll_ref_mean = out["log_likelihood"], out["log_likelihood_lossless"]
    out["log_likelihood_loss"] = (None if ll_rule_mean is None or ll_ref_mean is None
                                  else ll_ref_mean - ll_rule_mean)
    out["log_likelihood_loss_interval"] = None if ll is None else [ll[1], ll[2]]
    if correct_rule is not None and correct_ref is not None:
        k, k_ref = sum(correct_rule), sum(correct_ref)
        out.update(accuracy=k / n, accuracy_interval=list(wilson(k, n)), accuracy_lossless=k_ref / n,
                   accuracy_lossless_interval=list(wilson(k_ref, n)))
        paired = mean_interval([float(b) - float(a) for a, b in zip(correct_rule, correct_ref)])
        out.update(accuracy_loss=paired[0], accuracy_loss_interval=[paired[1], paired[2]])
    return out


def gate(quality: dict, max_loss: dict | None) -> str | None:
    """The one error line when a measured loss exceeds eval.max_quality_loss[metric] (or the metric
    was not measured), else None."""
    for key, bound in (max_loss or {}).items():
        if bound is None:
            continue
        value = quality.get(GATE_METRICS[key])
        if value is None:
            return (f"eval.max_quality_loss.{key}={bound}: {key} was not measured in this run "
                    "(accuracy needs a prompt set with answers, tv_distance eval.temperature > 0)")
        if value > bound:
            return (f"eval.max_quality_loss.{key}={bound} exceeded: the {key} loss is {value:.4g} "
                    f"(spec.acceptance={quality['acceptance']} against the lossless rule)")
    return None


def score_log_likelihoods(llm, outs) -> list[list[float]]:
    """The target's log-probability (raw logits) of each output token of outs, from one prefill of
    prompt + output per request (prompt_logprobs; tokens past llm.max_model_len - 1 are left out)."""
    seqs = [(o.prompt_token_ids + o.output_token_ids)[: llm.max_model_len - 1] for o in outs]
    scored = llm.generate([{"prompt_token_ids": s} for s in seqs],
                          SamplingParams(max_tokens=1, prompt_logprobs=0, ignore_eos=True))
    result = []
    for o, s, r in zip(outs, seqs, scored):
        start = len(o.prompt_token_ids)
        entries = (r.prompt_logprobs or [])[start:len(s)]
        result.append([e[tok].logprob for e, tok in zip(entries, s[start:]) if e is not None])
    return result


def correctness(outs, prompts) -> list[bool] | None:
    """Per request: its extracted answer matches the prompt's (GSM8K); None without answers."""
    if not prompts or any(p.answer is None for p in prompts):
        return None
    return [score([extract_predicted_answer(o.text)], [p.answer])[1] == 1 for o, p in zip(outs, prompts)]


def tv_samples(llm, prompts, params: SamplingParams, num_prompts: int, num_samples: int, max_tokens: int,
               seed: int) -> list[list[list[int]]]:
    """num_samples seeded samples (seeds seed + j) of max_tokens tokens for each of the first
    num_prompts prompts: [prompt][sample] -> tokens."""
    chosen = prompts[:num_prompts]
    reqs = [p.engine_input for p in chosen for _ in range(num_samples)]
    sps = [SamplingParams(max_tokens=max_tokens, temperature=params.temperature, top_k=params.top_k,
                          top_p=params.top_p, min_p=params.min_p, seed=seed + j, ignore_eos=True)
           for _ in chosen for j in range(num_samples)]
    outs = llm.generate(reqs, sps)
    return [[o.output_token_ids for o in outs[i * num_samples:(i + 1) * num_samples]]
            for i in range(len(chosen))]


def rule_text(spec_kw: dict) -> str:
    """"relaxed (relaxed_topk=3, relaxed_delta=0.1)": the rule and the settings it reads."""
    name = spec_kw.get("acceptance", "lossless")
    keys = {"typical": ("posterior_threshold", "posterior_alpha"),
            "relaxed": ("relaxed_topk", "relaxed_delta"), "lenient": ("lenient_lambda",),
            "cascade": ("cascade_alpha",),
            "synthetic": ("synthetic_acceptance_rates",)}.get(name, ())
    return name + (f" ({', '.join(f'{k}={spec_kw.get(k)}' for k in keys)})" if keys else "")


def quality_pass(run, outs, metrics: dict, interrupt) -> int:
    """mode=eval with a lossy rule (module doc): the lossless reference pass, eval.speed_repeats
    alternating timing passes, the quality record in metrics["quality"] (with a reference stored by
    an earlier job reused: mtpx.evaluate.reference), lossless_output_throughput,
    lossless_acceptance_length and speedup_vs_lossless, and the gate. Returns 1 when the gate
    fails, else 0 (also when Ctrl-C stopped a pass: interrupt.requested)."""
    from mtpx.engine.llm import LLM
    from mtpx.evaluate.generate import _generate
    from mtpx.evaluate.reference import cache_folder, load_reference, reference_key, save_reference
    from mtpx.metrics.stats import compute_metrics

    llm, c, spec = run.llm, run.c, run.cfg.spec
    k = spec.num_speculative_tokens
    ref_llm = LLM(model=llm.model, tokenizer=llm.tokenizer, spec=run.method, num_speculative_tokens=k,
                  cost_model_file=spec.get("cost_model_file") if k == "auto" else None,
                  **{**run.engine, **run.spec_kw, "acceptance": "lossless"})
    label = f"{run.method} lossless (quality reference)"
    ref, ref_duration, stopped = _generate(ref_llm, run.prompts, run.params, label, run.client, interrupt)
    if stopped:
        return 0
    ref_metrics = compute_metrics(ref, ref_duration, ref_llm.num_speculative_tokens)
    metrics["lossless_acceptance_length"] = ref_metrics["acceptance_length"]
    if not _speed_runs(run, ref_llm, metrics, ref_metrics["output_throughput"], interrupt):
        return 0
    folder, key = cache_folder(c), reference_key(run)
    ref_tokens = [o.output_token_ids for o in ref]
    stored = load_reference(folder, key, ref_tokens)
    prompts = [run.prompts[o.index] for o in outs]
    if stored is None:
        stored = {"tokens": ref_tokens, "log_likelihoods": score_log_likelihoods(ref_llm, ref),
                  "correct": correctness(ref, prompts), "tv": None}
    q = token_quality([o.output_token_ids for o in outs], ref_tokens, score_log_likelihoods(ref_llm, outs),
                      stored["log_likelihoods"], correctness(outs, prompts), stored["correct"])
    q["acceptance"] = rule_text(run.spec_kw)
    q["lossless_reference"] = "reused" if stored.get("key") == key else "computed"
    p0 = run.params[0]
    if not p0.greedy and c.get("tv_num_prompts"):
        args = (run.prompts, p0, c.tv_num_prompts, c.tv_num_samples, c.tv_max_tokens)
        # three independent seed ranges: samples of the rule and of the reference drawn with the
        # same seeds share their uniforms, which would bias the estimate low against its floor
        if stored["tv"] is None:
            stored["tv"] = [tv_samples(ref_llm, *args, seed=10_000), tv_samples(ref_llm, *args, seed=20_000)]
        q.update(tv_quality(tv_samples(llm, *args, seed=30_000), *stored["tv"], c.tv_max_tokens),
                 tv_num_samples=c.tv_num_samples, tv_max_tokens=c.tv_max_tokens)
    if stored.get("key") != key:
        try:
            save_reference(folder, key, stored)
        except (OSError, ValueError) as e:     # a full disk, or a log-probability of -inf
            print(f"lossless reference: not stored ({e})")
    metrics["quality"] = q
    line = gate(q, c.get("max_quality_loss"))
    if line is None:
        return 0
    metrics["quality_gate"] = line          # printed after the report (mtpx.evaluate.measure)
    return 1


def tv_quality(rule: list, ref: list, ref2: list, length: int) -> dict:
    """The TV entries of the quality record from [prompt][sample] -> tokens sample sets of the rule
    and of two independent reference draws: tv_distance (rule vs ref), tv_distance_floor (ref2 vs
    ref), tv_distance_loss (their difference) with a 95% interval from the per-prompt differences."""
    tv = [tv_distance(x, y, length) for x, y in zip(rule, ref)]
    floor = [tv_distance(x, y, length) for x, y in zip(ref2, ref)]
    loss = mean_interval([a - b for a, b in zip(tv, floor)])
    return {"tv_num_prompts": len(tv), "tv_distance": sum(tv) / len(tv),
            "tv_distance_floor": sum(floor) / len(floor), "tv_distance_loss": loss[0],
            "tv_distance_loss_interval": [loss[1], loss[2]]}


def _speed_runs(run, ref_llm, metrics: dict, ref_tps: float, interrupt) -> bool:
    """Speed of the rule against the lossless rule, same job: the measured pass (rule) and the
    reference pass (lossless) ran back to back; eval.speed_repeats - 1 more pairs follow in
    alternating order (lossless first, then rule first, ...), so that neither side always runs first.
    Sets output_throughput_runs, lossless_output_throughput_runs (tok/s per pass),
    lossless_output_throughput (their mean), speedup_vs_lossless (mean rule tok/s over mean lossless
    tok/s) and speedup_vs_lossless_runs (per pair). False when Ctrl-C stopped a pass."""
    from mtpx.evaluate.generate import _generate
    from mtpx.metrics.stats import compute_metrics

    rule_runs, ref_runs = [metrics["output_throughput"]], [ref_tps]
    for i in range(1, int(run.c.get("speed_repeats") or 1)):
        order = [(ref_llm, ref_runs), (run.llm, rule_runs)]
        for llm, runs in (order if i % 2 else order[::-1]):
            outs, seconds, stopped = _generate(llm, run.prompts, run.params, f"speed repeat {i}", run.client,
                                               interrupt)
            if stopped:
                return False
            runs.append(compute_metrics(outs, seconds, llm.num_speculative_tokens)["output_throughput"])
    mean_rule, mean_ref = sum(rule_runs) / len(rule_runs), sum(ref_runs) / len(ref_runs)
    metrics.update(output_throughput_runs=rule_runs, lossless_output_throughput_runs=ref_runs,
                   lossless_output_throughput=mean_ref,
                   speedup_vs_lossless=mean_rule / mean_ref if mean_ref else None,
                   speedup_vs_lossless_runs=[a / b if b else None for a, b in zip(rule_runs, ref_runs)])
    return True
