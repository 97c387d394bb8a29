"""mode=eval and mode=bench: decode a prompt set with (or without) an MTP speculator and report
spec-decode and serving metrics.

Both modes share one path (prompts, generation, metrics, report, W&B); they differ in the config
section of the benchmark client (cfg.eval or cfg.bench: num_prompts, max_tokens, concurrency,
request_rate, seed, temperature, top_k, top_p, min_p, threads) and in the lossless check, which
only mode=eval runs. The prompt set comes from cfg.data (mtpx.data.prompts.load_prompts): chat sets
(Spec-Bench, MT-Bench) go through the loaded tokenizer's chat template when it has one (metrics.json
records chat_template true/false), random prompts are token ids with a fixed output length.

Writes into the run directory: outputs.jsonl (one line per request, appended as each finishes, then
rewritten in prompt order; GSM8K rows carry the gold and the extracted answer), metrics.json, the
report table (stdout and report.txt), per_position_acceptance.png, and the same metrics to W&B (offline by
default). Each timed pass follows a 2-token warm-up request (then the prefix cache is emptied, so
the warm-up's blocks are not billed as hits).
The engine is configured by cfg.engine (block_size, num_blocks, enable_prefix_caching, max_num_seqs,
max_num_batched_tokens, max_model_len); the benchmark client by cfg.eval (cfg.bench): at most
concurrency requests in flight (vLLM bench's --max-concurrency), arriving all at once
(request_rate=inf) or as a Poisson process of request_rate requests/s seeded with seed.
With eval.check_lossless the prompts are decoded again without speculation and any request whose
tokens differ is a mismatch (exit code 1), unless the plain run's top-2 logit gap at the first
differing token is below eval.tie_tolerance (a near-tie: fp32 rounding between a k+1-token and a
1-token forward can flip an argmax there); near-ties are listed with their position and gap.
Sampling: eval.temperature (0 = greedy), eval.top_k, eval.top_p, eval.min_p; request i samples
with seed eval.seed + i, so a run is reproducible. At temperature > 0 outputs are not
token-identical to plain decoding, so the lossless check (a greedy-only check) is skipped; sampled
runs are checked against the target distribution by the engine's distribution tests. A spec's
draft_sample_method (greedy | probabilistic) and verify (standard | block) go to the LLM.
Ctrl-C or SIGTERM stops the engine at the next step: the requests that finished are written as
above, with "partial": true in metrics.json (also when only the lossless pass was cut short), and
the run exits 130 (SIGTERM: 143) with one line (mtpx.io.Interrupted); a second one stops at once.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from mtpx.data.gsm8k import extract_predicted_answer, score
from mtpx.data.prompts import Prompt, chat_template_applies, check_data_config, load_prompts
from mtpx.engine.config import resolve_compile
from mtpx.engine.llm import LLM
from mtpx.core.sampling_params import SamplingParams
from mtpx.engine.threads import ThreadChoice, choose_threads, contention_warning
from mtpx.io import (GracefulInterrupt, Interrupted, atomic_write_json, atomic_write_jsonl, atomic_write_text,
                     source_commit, utc_now)
from mtpx.metrics.analytics import analytics
from mtpx.engine.auto_k.costs import step_costs
from mtpx import schema
from mtpx.metrics.dashboard import run_identity, write_run_figures
from mtpx.metrics.logging import RunLogger, plot_per_position_acceptance
from mtpx.metrics.report import format_report
from mtpx.metrics.stats import RequestOutput, aggregate_spec, compute_metrics, is_failed
from mtpx.evaluate.args import (cap_max_tokens, client_args, engine_args, model_path,  # noqa: F401  (API)
                                poisson_arrival_offsets, sampling_params, spec_args)
from mtpx.evaluate.generate import _generate, _output_row, _Stop, finished_rows  # noqa: F401  (API)


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


def run_eval(cfg: DictConfig, out_dir: Path) -> int:
    """mode=eval: run the evaluation described by cfg (model, data, eval, engine, spec, logger),
    with the lossless check unless eval.check_lossless=false. Returns the exit code: 0, or 1 when
    the lossless check found a mismatch or every request failed."""
    return _run(cfg, out_dir, "eval")


def run_bench(cfg: DictConfig, out_dir: Path) -> int:
    """mode=bench: the serving benchmark described by cfg (model, data, bench, engine, spec,
    logger): the client of cfg.bench, the same generation, metrics, report and W&B logging as
    mode=eval, no lossless pass (and no lossless keys in metrics.json). Returns the exit code: 0,
    or 1 when every request failed."""
    return _run(cfg, out_dir, "bench")


def _run(cfg: DictConfig, out_dir: Path, mode: str) -> int:
    """mode=eval or mode=bench (the config section of the client). Config errors are raised
    (ValueError naming the key) before the model loads, where they do not depend on it."""
    c = cfg.get(mode)
    if c is None:
        raise ValueError(f"the config has no '{mode}' section: add '- {mode}: default' to the "
                         "defaults list of conf/config.yaml")
    spec = cfg.get("spec")
    spec_kw = spec_args(spec)          # the spec section's checks (mtpx/schema/groups.py)
    method = spec.method if spec is not None else None
    k = spec.num_speculative_tokens if spec is not None else None
    if k == 0:                  # k = 0 is plain decoding (a point of a sweep over k)
        method = None
    if OmegaConf.is_missing(cfg.model, "path"):
        raise ValueError("model.path is required with model=hf: add model.path=DIR (a Hugging Face checkpoint folder)")
    path = model_path(cfg)
    engine = engine_args(cfg.engine)
    schema.check(mode, c)          # the client section's checks, before the model loads
    num_prompts = c.get("num_prompts")
    engine["compile"] = resolve_compile(engine.get("compile"), mode, None if num_prompts is None else
                                        num_prompts * c.max_tokens)
    prompts_key = f"{mode}.num_prompts"
    check_data_config(cfg.data, num_prompts, num_prompts_key=prompts_key)
    if mode == "bench" and c.get("base_url"):
        return _run_http(cfg, out_dir, c, path, num_prompts, prompts_key)
    dtype = cfg.model.get("dtype") or "float32"
    requested = c.get("threads")
    if requested is not None:
        choose_threads(None, requested, f"{mode}.threads")   # validated and set before the model loads
    cost_file = spec.get("cost_model_file") if spec is not None and k == "auto" else None
    llm = LLM(model=path, spec=method, num_speculative_tokens=k, dtype=dtype, cost_model_file=cost_file,
              draft_path=spec.get("draft_path") if spec is not None else None,
              allow_pickle=bool(cfg.model.get("allow_pickle", False)), **engine, **spec_kw,
              threads=lambda model: choose_threads(model, requested, f"{mode}.threads"))
    threads = llm.thread_choice
    print(threads.describe())
    name = method or "no spec"
    if llm.calibration is not None:
        cal = llm.calibration
        print(f"num_speculative_tokens=auto: step costs {cal['source']}"
              + (f" in {cal['seconds']:.1f} s" if cal["seconds"] else ""))
    if llm.compile_stats is not None:
        cs = llm.compile_stats
        print(f"engine.compile: decode step built in {cs['compile_s']:.1f} s ({cs['num_graphs']} graphs: "
              f"{cs['num_compiled']} compiled, {cs['num_loaded']} loaded from the cache; layer regions "
              f"{'on' if cs['regions'] else 'off'}, torch.compile mode {cs['mode']})")

    prompts = load_prompts(cfg.data, num_prompts, llm.tokenizer, llm.model.cfg.vocab_size,
                           num_prompts_key=prompts_key)
    chat = chat_template_applies(cfg.data, llm.tokenizer)
    if chat is False and cfg.data.get("chat_template", True):
        print(f"chat template: the tokenizer of {path} has none; {cfg.data.name} prompts are sent "
              "as the raw first-turn text (metrics.json: chat_template false)")
    _check_fixed_lengths(prompts, llm.max_model_len)
    client = client_args(c, len(prompts), mode)
    params = sampling_params(c, len(prompts), mode, [p.output_len for p in prompts])
    params, cap = cap_max_tokens(prompts, params, llm.max_model_len, f"{mode}.max_tokens")

    rows_file = out_dir / "outputs.jsonl"
    rows_file.parent.mkdir(parents=True, exist_ok=True)
    restored = {}
    if mode == "eval" and c.get("resume"):
        restored = finished_rows(rows_file, prompts, llm)
        print(f"eval.resume: {len(restored)} of {len(prompts)} requests had finished in {rows_file}"
              + ("; generating the others" if len(restored) < len(prompts) else ""))
    else:
        rows_file.unlink(missing_ok=True)
    used = {key: cfg[key] for key in ("mode", "seed", "data_dir", "model", "data", "engine", "spec", "logger", mode)
            if cfg.get(key) is not None}                       # the groups this mode reads
    group, job = _sweep_group()
    wandb_config = OmegaConf.to_container(OmegaConf.create(used), resolve=True)
    # the architecture loaded (the model group's YAML describes only a fresh model), commit, threads
    wandb_config["model"] = {**llm.model.cfg.to_dict(), "path": str(path)}
    wandb_config.update(commit=source_commit(), threads=threads.threads if threads else None,
                        threads_reason=threads.reason if threads else None)
    logger = RunLogger(OmegaConf.to_container(cfg.logger, resolve=True), run_dir=out_dir,
                       config=wandb_config, group=group,
                       run_name=f"{method or 'plain'}-k{'auto' if k == 'auto' else llm.num_speculative_tokens}-{cfg.data.name}-"
                                f"{Path(str(path)).name}" + (f"-{job}" if job is not None else ""))
    try:
        with GracefulInterrupt() as interrupt:
            return _measure(cfg, out_dir, mode, llm, prompts, params, client, engine, spec_kw, chat, c,
                            method, name, dtype, interrupt, threads, logger, restored, cap)
    finally:
        logger.finish()


def _run_http(cfg: DictConfig, out_dir: Path, c: DictConfig, path, num_prompts: int | None, prompts_key: str) -> int:
    """mode=bench with bench.base_url: the same prompts, client and report, sent to an
    OpenAI-compatible server (mtpx.client.openai_http) instead of an in-process engine. The
    prompts are built with the tokenizer of model.path (the served model's), and sent as token
    ids where they have them (chat templates, random prompts), else as text."""
    from mtpx.client.openai_http import HttpSampling, run_http_client
    from mtpx.hf.loader import is_hf_folder, load_config, load_folder_tokenizer, require_folder

    folder = require_folder(path)
    tokenizer = load_folder_tokenizer(folder, is_hf_folder(folder))
    prompts = load_prompts(cfg.data, num_prompts, tokenizer, load_config(folder).vocab_size,
                           num_prompts_key=prompts_key)
    client = client_args(c, len(prompts), "bench")
    params = sampling_params(c, len(prompts), "bench", [p.output_len for p in prompts])
    http = [HttpSampling(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
                         top_k=p.top_k if p.top_k > 0 else -1, min_p=p.min_p, seed=p.seed, ignore_eos=p.ignore_eos)
            for p in params]
    t0 = time.perf_counter()
    outs = run_http_client(c.base_url, c.get("model_name"), [p.engine_input for p in prompts], http,
                           client["max_concurrency"], client["arrival_offsets"])
    duration = time.perf_counter() - t0
    _print_request_errors(outs)
    k = max((len(o.spec.accepted_per_position) for o in outs), default=0)
    metrics = compute_metrics(outs, duration, k)
    del metrics["lossless_mismatches"]
    metrics["run"] = {"mode": "bench", "base_url": c.base_url, "model": str(path), "spec": None if not k else "server",
                      "num_speculative_tokens": k, "data": cfg.data.name, "num_prompts": len(prompts),
                      "commit": source_commit(), "date": utc_now()}
    atomic_write_jsonl(out_dir / "outputs.jsonl", [_output_row(o, p) for o, p in zip(outs, prompts)])
    atomic_write_json(out_dir / "metrics.json", metrics)
    if _all_failed(outs, f"; no report (outputs.jsonl and metrics.json in {out_dir} hold the errors)"):
        return 1
    setup = _client_text(client, c)
    report = format_report(metrics, f"mtpx bench over HTTP: {c.base_url}, {_data_text(cfg.data.name, prompts, None)}, "
                                    f"{len(prompts)} prompts, {_length_text(prompts, c.max_tokens)}, "
                                    f"{_sampling_text(params[0])}, {', '.join(setup)}")
    print(report)
    atomic_write_text(out_dir / "report.txt", report + "\n")
    print(f"run directory: {out_dir}")
    return 0


def _sweep_group() -> tuple[str | None, int | None]:
    """(W&B group, job number) of a Hydra multirun job: its sweep folder and number; else (None, None)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return None, None
    if hc.mode != RunMode.MULTIRUN:
        return None, None
    return str(hc.sweep.dir), hc.job.num


def _measure(cfg, out_dir: Path, mode: str, llm: LLM, prompts, params, client, engine, spec_kw, chat, c,
             method, name: str, dtype: str, interrupt: GracefulInterrupt, threads: ThreadChoice,
             logger: RunLogger, restored: dict[int, RequestOutput], cap: int | None = None) -> int:
    """The measured pass, metrics, the lossless pass and every output file of _run. After Ctrl-C
    or SIGTERM the requests that finished are written (metrics.json with "partial": true) and
    Interrupted is raised. restored: requests an earlier run finished (eval.resume), not run
    again; the run's duration then adds the earlier run's (its last finish time)."""
    rows_file = out_dir / "outputs.jsonl"
    total = len(prompts)
    todo = [i for i in range(total) if i not in restored]
    clock = max((o.finish_time or 0.0 for o in restored.values()), default=0.0)
    outs, duration, stopped = [], 0.0, False
    if todo:
        offsets = client["arrival_offsets"]
        sub_client = {**client, "arrival_offsets": None if offsets is None else
                      [offsets[i] - offsets[todo[0]] for i in todo]}
        outs, duration, stopped = _generate(llm, [prompts[i] for i in todo], [params[i] for i in todo],
                                            f"{name}: {len(todo)} prompts", sub_client, interrupt, rows_file,
                                            logger, indices=todo, clock=clock)
    if restored:
        outs = sorted(outs + list(restored.values()), key=lambda o: o.index)
        duration += clock
    if stopped:
        if not outs:
            raise Interrupted(f"stopped before any of the {total} requests finished; nothing to keep")
    kept = [prompts[o.index] for o in outs]  # aligned with outs (all prompts unless stopped)
    _print_request_errors(outs)
    metrics = compute_metrics(outs, duration, llm.num_speculative_tokens,
                              engine["enable_prefix_caching"])
    if mode == "bench":
        del metrics["lossless_mismatches"]  # bench never runs the lossless pass
    # measured step costs (mtpx.engine.auto_k.costs): decode steps with a full k drafts, by batch size
    decodes = [t.num_decodes for t in llm.engine.step_timings if t.num_decodes]
    metrics["mean_decode_batch"] = sum(decodes) / len(decodes) if decodes else None
    metrics["step_costs"] = {str(b): c for b, c in step_costs(llm.engine.step_timings,
                                                              llm.num_speculative_tokens).items()}
    if chat is not None:
        metrics["chat_template"] = chat
    metrics["run"] = {"mode": mode, "model": str(model_path(cfg)), "dtype": dtype,
                      "spec": method, "num_speculative_tokens": llm.num_speculative_tokens if method else 0,
                      "automatic_k": bool(method) and llm.engine.draft_length.auto,
                      "data": cfg.data.name, "num_prompts": total, "threads": threads.threads,
                      "threads_reason": threads.reason, "torch": torch.__version__, "commit": source_commit(), "date": utc_now()}
    if not stopped and outs and all(o.error for o in outs):
        # nothing to report or plot: the error lines above say why; the rows and counts are kept
        if "lossless_mismatches" in metrics:
            metrics["lossless_mismatches"] = None                 # not checked
        atomic_write_jsonl(rows_file, [_output_row(o, p) for o, p in zip(outs, kept)])
        atomic_write_json(out_dir / "metrics.json", metrics)
        logger.log_metrics_summary(metrics)
        _all_failed(outs, f"; no report, figures or lossless check (outputs.jsonl and metrics.json in {out_dir} "
                          "hold the errors)")
        return 1
    dead = (dead_position_warning(aggregate_spec(outs), rounds=[x for o in outs for x in o.spec.rounds])
            if method is not None else None)
    if dead:
        print(dead, file=sys.stderr)
        metrics["acceptance_warning"] = dead
    contended = contention_warning(llm.model, threads)
    if contended:
        print(contended, file=sys.stderr)
        metrics["contention_warning"] = contended
    if llm.compile_stats is not None:
        metrics["compile"] = llm.compile_stats
    policy = llm.engine.draft_length
    if method is not None and policy.auto:    # the k chosen per decode step, and why
        metrics["k_histogram"] = {str(k): n for k, n in sorted(policy.histogram.items())}
        metrics["auto_k"] = {**policy.summary(), "calibration": llm.calibration}
    if method is not None:
        metrics["analytics"] = analytics([o.spec.rounds for o in outs], [p.category for p in kept],
                                         llm.num_speculative_tokens)
        for category, row in metrics["analytics"]["by_category"].items():  # for the report's table
            row["num_failed"] = sum(is_failed(o) for o in outs if prompts[o.index].category == category)
    if any(p.answer is not None for p in kept):
        preds = [extract_predicted_answer(o.text) for o in outs]
        metrics["accuracy"], metrics["num_correct"] = score(preds, [p.answer for p in kept])

    if restored:
        metrics["resumed_requests"] = len(restored)     # finished by an earlier run (eval.resume)
    code = 0
    if stopped:
        metrics["partial"] = True
        metrics["num_prompts_requested"] = total
    elif mode == "eval" and c.check_lossless and method is not None:
        code = _lossless_check(llm, outs, prompts, params, client, engine, c, metrics, interrupt)
        if interrupt.requested:  # the measured pass finished; the lossless pass did not
            metrics["partial"], metrics["lossless_check"] = True, "interrupted"

    atomic_write_jsonl(rows_file, [_output_row(o, p) for o, p in zip(outs, kept)])
    atomic_write_json(out_dir / "metrics.json", metrics)
    k_text = f", k={llm.num_speculative_tokens}" if method is not None else ""
    if method is not None:
        k_text += (f", draft {spec_kw.get('draft_sample_method', 'greedy')}, "
                   f"verify {spec_kw.get('verify', 'standard')}")
    setup = _client_text(client, c) + [f"{threads.threads} threads"]
    if engine["enable_prefix_caching"]:
        setup.append("prefix caching")
    report = format_report(metrics, f"mtpx {mode}: {name}{k_text}, {_data_text(cfg.data.name, kept, chat)}, "
                                    f"{_count_text(len(kept), total)}, {_length_text(kept, c.max_tokens, cap)}, "
                                    f"{_sampling_text(params[0])}, {dtype}, {', '.join(setup)}")
    print(report)
    atomic_write_text(out_dir / "report.txt", report + "\n")
    if method is not None:
        plot_per_position_acceptance({name: metrics}, out_dir / "per_position_acceptance.png", run_identity(metrics))
    figures = write_run_figures(metrics, out_dir)  # conditional acceptance, position-0 buckets, by category
    logger.log_metrics_summary(metrics)
    logger.log_images([out_dir / "per_position_acceptance.png", *figures])
    print(f"run directory: {out_dir}")
    if stopped:
        again = " (eval.resume=true with hydra.run.dir=that folder finishes the rest)" if mode == "eval" else ""
        raise Interrupted(f"{len(outs)} of {total} requests had finished; their outputs.jsonl, report and "
                          f"metrics.json (\"partial\": true) are in {out_dir}{again}")
    if metrics.get("lossless_check") == "interrupted":
        raise Interrupted(f"the measured pass of {total} requests finished and is written to {out_dir}; "
                          "the lossless pass was interrupted (metrics.json: \"partial\": true)")
    return 1 if _all_failed(outs) else code


def dead_position_warning(spec, min_tries: int = 20, rounds=None) -> str | None:
    """A line when some draft position accepted nothing in at least `min_tries` rounds that reached
    it (the previous position was accepted, and the round drafted that far: `rounds`, the
    (num_draft_tokens, num_accepted, ...) records of every request, counts it; without them every
    round is assumed to draft all positions), the sign of a broken draft module (NaN weights, a
    module trained for another target); None otherwise."""
    counts = spec.accepted_per_position
    for i in range(1, len(counts)):
        reached = counts[i - 1] if rounds is None else sum(1 for r in rounds if r[0] > i and r[1] >= i)
        if reached >= min_tries and counts[i] == 0:
            return (f"warning: draft position {i} (counted from 0, as in per_position_acceptance and the figures) "
                    f"accepted 0 of the {reached} drafts that reached it (position {i - 1} accepted them): "
                    f"check the weights of the module that drafts it (mtp.{i} with one module per position)")
    return None


def _print_request_errors(outs: list[RequestOutput]) -> None:
    for o in outs:
        if o.error:
            print(f"error: request {o.index}: {o.error}", file=sys.stderr)


def _all_failed(outs: list[RequestOutput], what: str = "") -> bool:
    """True (with one error line, `what` appended) when every request failed: the run's exit code
    is then 1."""
    if outs and all(o.error for o in outs):
        print(f"error: all {len(outs)} requests failed (the error lines above say why){what}", file=sys.stderr)
        return True
    return False


def _client_text(client: dict, c: DictConfig) -> list[str]:
    """The report title's client part: concurrency, and the request rate when arrivals are timed."""
    setup = [f"concurrency {client['max_concurrency'] or 'unlimited'}"]
    if client["arrival_offsets"] is not None:
        setup.append(f"{float(c.request_rate):g} req/s")
    return setup


def _count_text(n: int, total: int) -> str:
    return f"{n} prompts" if n == total else f"{n} of {total} prompts (interrupted)"


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
              f"{plain_llm.compile_stats['compile_s']:.1f} s ({plain_llm.compile_stats['num_graphs']} graphs)")
    plain, plain_duration, stopped = _generate(plain_llm, prompts, params,
                                               "plain decoding (lossless check)", client, interrupt)
    if stopped:
        return 0
    mismatches, near_ties = compare_outputs(outs, plain, e.tie_tolerance)
    metrics["lossless_mismatches"] = len(mismatches)
    metrics["lossless_near_ties"] = near_ties    # [{index, position, gap}]; count = len
    metrics["plain_output_throughput"] = compute_metrics(plain, plain_duration, 0)["output_throughput"]
    for m in mismatches:
        print(f"error: request {m['index']} differs from plain decoding at output token "
              f"{m['position']} (top-2 logit gap {m['gap']}): speculative decoding is not lossless",
              file=sys.stderr)
    return 1 if mismatches else 0


def _check_fixed_lengths(prompts: list[Prompt], max_model_len: int) -> None:
    """Prompts with a fixed output length (data=random) must fit the model with all of it;
    ValueError naming data.input_len / data.output_len otherwise."""
    p = next((p for p in prompts if p.output_len is not None), None)
    if p is not None and len(p.engine_input) + p.output_len > max_model_len:
        raise ValueError(f"data.input_len={len(p.engine_input)} + data.output_len={p.output_len} "
                         f"exceed the model's maximum length {max_model_len} (engine.max_model_len, "
                         "default max_position_embeddings): lower them")


def _data_text(name: str, prompts: list[Prompt], chat: bool | None) -> str:
    """The data set in the report title: "mt_bench (chat template)", "random (input_len 64)"."""
    if chat is not None:
        return f"{name} ({'chat template' if chat else 'raw text, no chat template'})"
    if prompts[0].output_len is not None:
        return f"{name} (input_len {len(prompts[0].engine_input)})"
    return name


def _length_text(prompts: list[Prompt], max_tokens: int, cap: int | None = None) -> str:
    """"max_tokens 128", "max_tokens 100000 capped to 1017 by max_model_len 1024" (cap: the most
    output tokens any request can have, cap_max_tokens), or "output_len 32 (ignore_eos)" for
    fixed-length prompts."""
    if prompts[0].output_len is not None:
        return f"output_len {prompts[0].output_len} (ignore_eos)"
    return f"max_tokens {max_tokens}" + (f" (capped to {cap} by max_model_len)" if cap is not None else "")


def _sampling_text(p: SamplingParams) -> str:
    """"temperature 1, top_k 50, top_p 0.9": the temperature, then the filters that are set."""
    parts = [f"temperature {p.temperature:g}"]
    if p.top_k not in (0, -1):
        parts.append(f"top_k {p.top_k}")
    if p.top_p != 1.0:
        parts.append(f"top_p {p.top_p:g}")
    if p.min_p != 0.0:
        parts.append(f"min_p {p.min_p:g}")
    return ", ".join(parts)
