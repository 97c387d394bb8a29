"""mode=eval: decode a prompt set with (or without) an MTP speculator and report spec-decode metrics.

Writes into the run directory: outputs.jsonl (one line per request), metrics.json, the report table
(stdout and report.txt), per_position_acceptance.png, and the same metrics to W&B (offline by
default). Each timed pass follows a 2-token warm-up request.
With eval.check_lossless the prompts are decoded again without speculation and any request whose
tokens differ is a mismatch (exit code 1), unless the plain run's top-2 logit gap at the first
differing token is below eval.tie_tolerance (a near-tie: fp32 rounding between a k+1-token and a
1-token forward can flip an argmax there); near-ties are listed with their position and gap.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.progress import Progress

from mtpx.data.gsm8k import extract_predicted_answer, score
from mtpx.data.prompts import load_prompts
from mtpx.engine.llm import DEFAULT_MODEL, LLM
from mtpx.engine.sampling_params import SamplingParams
from mtpx.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from mtpx.metrics.logging import RunLogger, plot_per_position_acceptance
from mtpx.metrics.report import format_report
from mtpx.metrics.stats import RequestOutput, compute_metrics


def compare_outputs(spec: list[RequestOutput], plain: list[RequestOutput], tie_tolerance: float):
    """Token-by-token comparison of a speculative run against plain decoding.

    Returns (mismatches, near_ties): lists of {"index", "position", "gap"} for each request whose
    outputs differ, position = first differing output token, gap = the plain run's top-2 logit gap
    there (None past the end of the plain output). A difference with gap < tie_tolerance is a near-tie.
    """
    mismatches, near_ties = [], []
    for s, p in zip(spec, plain):
        a, b = s.output_token_ids, p.output_token_ids
        if a == b:
            continue
        pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        gap = p.logit_gaps[pos] if p.logit_gaps is not None and pos < len(p.logit_gaps) else None
        entry = {"index": s.index, "position": pos, "gap": gap}
        (near_ties if gap is not None and gap < tie_tolerance else mismatches).append(entry)
    return mismatches, near_ties


def _generate(llm: LLM, prompts, params, label: str):
    """Timed generation after a 2-token warm-up request (first-call allocations and lazy
    initialisation are not billed to the first measured run)."""
    llm.generate([prompts[0].text], SamplingParams(max_tokens=2))
    with Progress(transient=True) as progress:
        task = progress.add_task(label, total=len(prompts))
        t0 = time.perf_counter()
        outs = llm.generate([p.text for p in prompts], params,
                            on_finish=lambda r: progress.advance(task))
        return outs, time.perf_counter() - t0


def run_eval(cfg: DictConfig, out_dir: Path) -> int:
    """Run the evaluation described by cfg (model, data, eval, spec, logger). Returns the exit
    code: 0, or 1 when the lossless check found a mismatch."""
    e = cfg.eval
    spec = cfg.get("spec")
    method = spec.method if spec is not None else None
    k = spec.num_speculative_tokens if spec is not None else None
    path = cfg.model.get("path") or DEFAULT_MODEL
    llm = LLM(model=path, spec=method, num_speculative_tokens=k, max_num_seqs=e.concurrency,
              dtype=e.dtype, threads=e.get("threads"))
    prompts = load_prompts(cfg.data, e.num_prompts)
    params = SamplingParams(max_tokens=e.max_tokens)
    name = method or "no spec"

    outs, duration = _generate(llm, prompts, params, f"{name}: {len(prompts)} prompts")
    for o in outs:
        if o.error:
            print(f"error: request {o.index}: {o.error}", file=sys.stderr)
    metrics = compute_metrics(outs, duration, llm.num_speculative_tokens)
    if any(p.answer is not None for p in prompts):
        preds = [extract_predicted_answer(o.text) for o in outs]
        metrics["accuracy"], metrics["num_correct"] = score(preds, [p.answer for p in prompts])

    code = 0
    if e.check_lossless and method is not None:
        plain_llm = LLM(model=llm.model, tokenizer=llm.tokenizer, spec=None,
                        max_num_seqs=e.concurrency, record_logit_gaps=True)
        plain, plain_duration = _generate(plain_llm, prompts, params, "plain decoding (lossless check)")
        mismatches, near_ties = compare_outputs(outs, plain, e.tie_tolerance)
        metrics["lossless_mismatches"] = len(mismatches)
        metrics["lossless_near_ties"] = near_ties    # [{index, position, gap}]; count = len
        metrics["plain_output_throughput"] = compute_metrics(plain, plain_duration, 0)["output_throughput"]
        for m in mismatches:
            print(f"error: request {m['index']} differs from plain decoding at output token "
                  f"{m['position']} (top-2 logit gap {m['gap']}): speculative decoding is not lossless",
                  file=sys.stderr)
        code = 1 if mismatches else 0

    atomic_write_jsonl(out_dir / "outputs.jsonl", [
        {"index": o.index, "output_token_ids": o.output_token_ids, "text": o.text,
         "finish_reason": o.finish_reason, "error": o.error, "num_drafts": o.spec.num_drafts,
         "num_draft_tokens": o.spec.num_draft_tokens, "num_accepted_tokens": o.spec.num_accepted_tokens}
        for o in outs])
    atomic_write_json(out_dir / "metrics.json", metrics)
    k_text = f", k={llm.num_speculative_tokens}" if method is not None else ""
    report = format_report(metrics, f"mtpx eval: {name}{k_text}, {cfg.data.name}, {len(prompts)} "
                                    f"prompts, max_tokens {e.max_tokens}, {e.dtype}")
    print(report)
    atomic_write_text(out_dir / "report.txt", report + "\n")
    if method is not None:
        plot_per_position_acceptance({name: metrics}, out_dir / "per_position_acceptance.png")
    logger = RunLogger(OmegaConf.to_container(cfg.logger, resolve=True), run_dir=out_dir,
                       config=OmegaConf.to_container(cfg, resolve=True))
    try:
        logger.log_metrics_summary(metrics)
    finally:
        logger.finish()
    print(f"run directory: {out_dir}")
    return code
