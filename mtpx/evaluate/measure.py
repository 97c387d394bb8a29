"""The measured part of mode=eval and mode=bench, once the model, prompts and logger are ready
(mtpx.evaluate._run): the timed pass, metrics.json with its diagnostics, the lossless pass of
mode=eval, outputs.jsonl, the report, the figures and the W&B summary."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from mtpx.data.gsm8k import extract_predicted_answer, score
from mtpx.data.prompts import Prompt
from mtpx import auto_k
from mtpx.auto_k.costs import step_costs
from mtpx.engine.llm import LLM
from mtpx.core.sampling_params import SamplingParams
from mtpx.engine.threads import ThreadChoice, contention_warning
from mtpx.evaluate.args import model_path
from mtpx.evaluate.generate import _generate, _output_row
from mtpx.evaluate.quality import quality_pass, rule_text
from mtpx.evaluate.lines import (_all_failed, _client_text, _count_text, _data_text, _length_text,
                                 _print_request_errors, _sampling_text, dead_position_warning)
from mtpx.io import (GracefulInterrupt, Interrupted, atomic_write_json, atomic_write_jsonl, atomic_write_text,
                     disk_error_line, source_commit, utc_now)
from mtpx.metrics.analytics import analytics
from mtpx.metrics.dashboard import run_identity, write_run_figures
from mtpx.metrics.logging import RunLogger, plot_per_position_acceptance
from mtpx.metrics.report import format_report
from mtpx.metrics.stats import RequestOutput, aggregate_spec, compute_metrics, is_failed


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


@dataclass
class _Run:
    """Everything _run prepared for the measured pass.

    Attributes:
        cfg: the run config; c: its client section (cfg.eval or cfg.bench); mode: "eval" | "bench".
        out_dir: the run directory.
        llm: the engine; prompts, params: the prompt set and one SamplingParams per prompt.
        client: generate()'s max_concurrency and arrival_offsets (client_args).
        engine, spec_kw: the LLM's engine and speculator keyword arguments.
        chat: chat_template_applies (None: not a chat set).
        method: the speculator (None: plain decoding); name: its label ("no spec" without one).
        dtype: the weights' dtype name; threads: the engine's thread choice.
        logger: the W&B run; restored: requests an earlier run finished (eval.resume).
        cap: the most output tokens any request can have when max_tokens was capped, else None.
        skipped: prompts of max_model_len tokens or more that mode=bench left out.
    """

    cfg: DictConfig
    c: DictConfig
    mode: str
    out_dir: Path
    llm: LLM
    prompts: list[Prompt]
    params: list[SamplingParams]
    client: dict
    engine: dict
    spec_kw: dict
    chat: bool | None
    method: str | None
    name: str
    dtype: str
    threads: ThreadChoice
    logger: RunLogger
    restored: dict[int, RequestOutput]
    cap: int | None = None
    skipped: int = 0            # prompts too long for max_model_len, left out (mode=bench)

    @property
    def rows_file(self) -> Path:
        return self.out_dir / "outputs.jsonl"


def _measure(run: _Run, interrupt: GracefulInterrupt) -> int:
    """The measured pass, metrics, the lossless pass and every output file of _run. After Ctrl-C
    or SIGTERM the requests that finished are written (metrics.json with "partial": true) and
    Interrupted is raised. run.restored: requests an earlier run finished (eval.resume), not run
    again; the run's duration then adds the earlier run's (its last finish time)."""
    total = len(run.prompts)
    outs, duration, stopped = _measured_pass(run, interrupt)
    kept = [run.prompts[o.index] for o in outs]  # aligned with outs (all prompts unless stopped)
    _print_request_errors(outs)
    metrics = _run_metrics(run, outs, duration)
    if not stopped and outs and all(o.error for o in outs):
        return _write_failed(run, outs, kept, metrics)
    _add_diagnostics(run, outs, kept, metrics)

    if run.skipped:
        metrics["num_prompts_skipped"] = run.skipped          # longer than max_model_len (mode=bench)
    if run.restored:
        metrics["resumed_requests"] = len(run.restored)     # finished by an earlier run (eval.resume)
    code = 0
    if stopped:
        metrics["partial"] = True
        metrics["num_prompts_requested"] = total
    elif run.mode == "eval" and run.method is not None and metrics.get("lossy"):
        code = quality_pass(run, outs, metrics, interrupt)   # the lossless reference beside the rule
        if interrupt.requested:
            metrics["partial"], metrics["quality"] = True, "interrupted"
    elif run.mode == "eval" and run.c.check_lossless is not False and run.method is not None:
        code = _lossless_check(run.llm, outs, run.prompts, run.params, run.client, run.engine, run.c, metrics,
                               interrupt)
        if interrupt.requested:  # the measured pass finished; the lossless pass did not
            metrics["partial"], metrics["lossless_check"] = True, "interrupted"

    _write_outputs(run, outs, kept, metrics)
    if stopped:
        again = (" (eval.resume=true with hydra.run.dir=that folder finishes the rest)" if run.mode == "eval"
                 else "")
        raise Interrupted(f"{len(outs)} of {total} requests had finished; their outputs.jsonl, report and "
                          f"metrics.json (\"partial\": true) are in {run.out_dir}{again}")
    if metrics.get("quality_gate"):
        print(f"error: {metrics['quality_gate']}", file=sys.stderr)
    if metrics.get("lossless_check") == "interrupted" or metrics.get("quality") == "interrupted":
        raise Interrupted(f"the measured pass of {total} requests finished and is written to {run.out_dir}; "
                          "the lossless pass was interrupted (metrics.json: \"partial\": true)")
    return 1 if _all_failed(outs) else code


def _measured_pass(run: _Run, interrupt: GracefulInterrupt) -> tuple[list[RequestOutput], float, bool]:
    """Generate the requests not in run.restored, on the run's clock (after the restored ones'
    last finish time). Returns (every request's output in index order, duration in seconds with
    the earlier run's, stopped by Ctrl-C or SIGTERM); raises Interrupted when stopped before any
    request finished."""
    restored, total = run.restored, len(run.prompts)
    todo = [i for i in range(total) if i not in restored]
    clock = max((o.finish_time or 0.0 for o in restored.values()), default=0.0)
    outs, duration, stopped = [], 0.0, False
    if todo:
        offsets = run.client["arrival_offsets"]
        sub_client = {**run.client, "arrival_offsets": None if offsets is None else
                      [offsets[i] - offsets[todo[0]] for i in todo]}
        outs, duration, stopped = _generate(run.llm, [run.prompts[i] for i in todo],
                                            [run.params[i] for i in todo], f"{run.name}: {len(todo)} prompts",
                                            sub_client, interrupt, run.rows_file, run.logger, indices=todo,
                                            clock=clock)
    if restored:
        outs = sorted(outs + list(restored.values()), key=lambda o: o.index)
        duration += clock
    if stopped:
        if not outs:
            raise Interrupted(f"stopped before any of the {total} requests finished; nothing to keep")
    return outs, duration, stopped


def _run_metrics(run: _Run, outs: list[RequestOutput], duration: float) -> dict:
    """compute_metrics of the measured pass (no lossless key in mode=bench), with the engine's
    measured step costs, chat_template and the "run" record."""
    llm, method, total = run.llm, run.method, len(run.prompts)
    metrics = compute_metrics(outs, duration, llm.num_speculative_tokens,
                              run.engine["enable_prefix_caching"])
    lossy = method is not None and run.spec_kw.get("acceptance", "lossless") != "lossless"
    if run.mode == "bench" or lossy:
        del metrics["lossless_mismatches"]  # bench never runs the lossless pass, nor a lossy rule
    if lossy:                           # never called lossless: the rule, and "lossy": true
        metrics["lossy"], metrics["acceptance"] = True, rule_text(run.spec_kw)
    # measured step costs (mtpx.auto_k.costs): decode steps with a full k drafts, by batch size
    decodes = [t.num_decodes for t in llm.engine.step_timings if t.num_decodes]
    metrics["mean_decode_batch"] = sum(decodes) / len(decodes) if decodes else None
    metrics["step_costs"] = {str(b): c for b, c in step_costs(llm.engine.step_timings,
                                                              llm.num_speculative_tokens).items()}
    if run.chat is not None:
        metrics["chat_template"] = run.chat
    metrics["run"] = {"mode": run.mode, "model": str(model_path(run.cfg)), "dtype": run.dtype,
                      "spec": method, "num_speculative_tokens": llm.num_speculative_tokens if method else 0,
                      "automatic_k": bool(method) and auto_k.summary(llm.engine.draft_length) is not None,
                      "data": run.cfg.data.name, "num_prompts": total, "threads": run.threads.threads,
                      "threads_reason": run.threads.reason, "torch": torch.__version__,
                      "commit": source_commit(), "date": utc_now()}
    return metrics


def _write_failed(run: _Run, outs: list[RequestOutput], kept: list[Prompt], metrics: dict) -> int:
    """Every request failed: write the rows and metrics.json (no report, figures or lossless
    check), log the summary, print the error line. Returns the exit code 1."""
    # nothing to report or plot: the error lines above say why; the rows and counts are kept
    if "lossless_mismatches" in metrics:
        metrics["lossless_mismatches"] = None                 # not checked
    atomic_write_jsonl(run.rows_file, [_output_row(o, p) for o, p in zip(outs, kept)])
    atomic_write_json(run.out_dir / "metrics.json", metrics)
    run.logger.log_metrics_summary(metrics)
    _all_failed(outs, "; no report, figures or lossless check (outputs.jsonl and metrics.json in "
                      f"{run.out_dir} hold the errors)")
    return 1


def _add_diagnostics(run: _Run, outs: list[RequestOutput], kept: list[Prompt], metrics: dict) -> None:
    """Add to metrics (and print the warnings): a dead draft position, thread contention, the
    compile stats, automatic k's histogram, the acceptance analytics and the GSM8K accuracy."""
    llm, method = run.llm, run.method
    tree = getattr(llm.engine.runner, "tree_stats", None)       # tree drafting (docs/trees.md)
    if tree is not None:
        metrics["tree"] = tree.summary()
    dead = (dead_position_warning(aggregate_spec(outs), rounds=[x for o in outs for x in o.spec.rounds])
            if method is not None and tree is None else None)
    if dead:
        print(dead, file=sys.stderr)
        metrics["acceptance_warning"] = dead
    contended = contention_warning(llm.model, run.threads)
    if contended:
        print(contended, file=sys.stderr)
        metrics["contention_warning"] = contended
    if llm.compile_stats is not None:
        metrics["compile"] = llm.compile_stats
    summary = auto_k.summary(llm.engine.draft_length)
    if method is not None and summary is not None:    # the k chosen per decode step, and why
        metrics["k_histogram"] = summary["k_histogram"]
        metrics["auto_k"] = {**summary, "calibration": llm.calibration}
    if method is not None:
        metrics["analytics"] = analytics([o.spec.rounds for o in outs], [p.category for p in kept],
                                         llm.num_speculative_tokens)
        for category, row in metrics["analytics"]["by_category"].items():  # for the report's table
            row["num_failed"] = sum(is_failed(o) for o in outs if run.prompts[o.index].category == category)
    if method is not None and any(p.structured_outputs is not None for p in run.params):
        metrics["structured_outputs"] = structured_metrics(llm, outs, run.params)
    if any(p.answer is not None for p in kept):
        preds = [extract_predicted_answer(o.text) for o in outs]
        metrics["accuracy"], metrics["num_correct"] = score(preds, [p.answer for p in kept])


def _write_outputs(run: _Run, outs: list[RequestOutput], kept: list[Prompt], metrics: dict) -> None:
    """outputs.jsonl, metrics.json, the report (stdout and report.txt), the figures, and the W&B
    summary and images."""
    llm, method, c, out_dir = run.llm, run.method, run.c, run.out_dir
    failed: list[OSError] = []       # a full disk or a file-size limit: write what can be, then say so

    def attempt(write, *args):
        try:
            return write(*args)
        except OSError as e:
            if disk_error_line(e) is None:
                raise
            failed.append(e)
            return None
    attempt(atomic_write_jsonl, run.rows_file, [_output_row(o, p) for o, p in zip(outs, kept)])
    attempt(atomic_write_json, out_dir / "metrics.json", metrics)
    k_text = f", k={llm.num_speculative_tokens}" if method is not None else ""
    if method is not None:
        k_text += (f", draft {run.spec_kw.get('draft_sample_method', 'greedy')}, "
                   f"verify {run.spec_kw.get('verify', 'standard')}")
        if metrics.get("lossy"):
            k_text += f", LOSSY acceptance {metrics['acceptance']}"
    setup = _client_text(run.client, c) + [f"{run.threads.threads} threads"]
    if run.engine["enable_prefix_caching"]:
        setup.append("prefix caching")
    report = format_report(metrics, f"mtpx {run.mode}: {run.name}{k_text}, "
                                    f"{_data_text(run.cfg.data.name, kept, run.chat)}, "
                                    f"{_count_text(len(kept), len(run.prompts), run.skipped)}, "
                                    f"{_length_text(kept, c.max_tokens, run.cap)}, "
                                    f"{_sampling_text(run.params[0])}, {run.dtype}, {', '.join(setup)}")
    print(report)
    attempt(atomic_write_text, out_dir / "report.txt", report + "\n")
    if method is not None and any(v is not None for v in metrics["per_position_acceptance"]):
        # (automatic k may choose k = 0 at every step: then nothing was drafted and there is nothing to plot)
        attempt(plot_per_position_acceptance, {run.name: metrics}, out_dir / "per_position_acceptance.png",
                run_identity(metrics))
    # acceptance; with automatic k its histograms, cost model
    figures = attempt(write_run_figures, metrics, out_dir) or []
    run.logger.log_metrics_summary(metrics)
    run.logger.log_images([out_dir / "per_position_acceptance.png", *figures])
    print(f"run directory: {out_dir}")
    if failed:          # the entry point prints it as one line naming the file (mtpx.io.disk_error_line)
        raise failed[0]


def _lossless_check(llm: LLM, outs, prompts, params, client: dict, engine: dict, e: DictConfig,
                    metrics: dict, interrupt: GracefulInterrupt) -> int:
    """The lossless check of mode=eval (module doc): greedy runs are decoded again without
    speculation and compared; sampled runs skip it with one line. Adds lossless_mismatches,
    lossless_near_ties and plain_output_throughput to metrics. Returns 1 on a mismatch, else 0
    (also when Ctrl-C stopped it: interrupt.requested is then set and nothing is added)."""
    if not params[0].greedy:
        print(f"lossless check skipped: it is a greedy-only check (eval.temperature=0); sampled runs "
              f"(eval.temperature={params[0].temperature:g}) are checked by the distribution tests")
        return 0
    plain_llm = LLM(model=llm.model, tokenizer=llm.tokenizer, spec=None,  # compiled too with engine.compile:
                    **{**engine, "record_logit_gaps": True})                # the throughputs compare alike
    if plain_llm.compile_stats is not None:
        metrics["compile_plain"] = plain_llm.compile_stats
        print(f"engine.compile: plain decoding (lossless check) compiled in "
              f"{plain_llm.compile_stats['compile_s']:.1f} s "
              f"({plain_llm.compile_stats['num_graphs']} graphs)")
    plain, plain_duration, stopped = _generate(plain_llm, prompts, params,
                                               "plain decoding (lossless check)", client, interrupt)
    if stopped:
        return 0
    mismatches, near_ties = compare_outputs(outs, plain, e.tie_tolerance)
    metrics["lossless_mismatches"] = len(mismatches)
    metrics["lossless_near_ties"] = near_ties    # [{index, position, gap}]; count = len
    metrics["plain_output_throughput"] = compute_metrics(plain, plain_duration, 0)["output_throughput"]
    _speedup_lines(metrics, client)
    for m in mismatches:
        print(f"error: request {m['index']} differs from plain decoding at output token "
              f"{m['position']} (top-2 logit gap {m['gap']}): speculative decoding is not lossless",
              file=sys.stderr)
    return 1 if mismatches else 0


def _speedup_lines(metrics: dict, client: dict) -> None:
    """metrics' speculative_speedup (output throughput over plain decoding's, same prompts and
    client) and, when speculation loses, speedup_hint: why that happens and what to try."""
    plain, spec = metrics.get("plain_output_throughput"), metrics.get("output_throughput")
    if not plain or spec is None:
        return
    ratio = metrics["speculative_speedup"] = round(spec / plain, 3)
    if ratio < 1:
        concurrency = client.get("max_concurrency")
        batch = f" at concurrency {concurrency}" if concurrency else ""
        metrics["speedup_hint"] = (
            f"speculation is {ratio:.2f}x plain decoding{batch}: verifying k drafts costs more than the "
            f"{metrics.get('acceptance_length') or 0:.2f} tokens a step commits; try "
            "spec.num_speculative_tokens=auto (k per step, 0 where drafts do not pay), a smaller k, or "
            "a lower concurrency (a full batch leaves the CPU no idle compute for drafts)")
        print(f"note: {metrics['speedup_hint']}")


def structured_metrics(llm, outs: list[RequestOutput], params) -> dict:
    """metrics.json's structured_outputs: acceptance of constrained and unconstrained requests
    (mtpx.metrics.analytics.by_category's fields, by "constrained" / "unconstrained"), and the
    grammar masks' host time per engine step of the run, ms (target columns: mask_ms_per_step;
    draft logits: draft_mask_ms_per_step; mtpx/structured/)."""
    from mtpx.metrics.analytics import by_category
    labels = ["constrained" if params[o.index].structured_outputs is not None else "unconstrained"
              for o in outs]
    masks, steps = llm.engine.runner.grammars, max(llm.engine.num_steps, 1)
    return {"by_constraint": by_category([o.spec.rounds for o in outs], labels, llm.num_speculative_tokens),
            "mask_ms_per_step": 1000 * masks.seconds / steps,
            "draft_mask_ms_per_step": 1000 * masks.draft_seconds / steps, "num_steps": llm.engine.num_steps}
