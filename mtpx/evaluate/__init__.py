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

import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mtpx.data.prompts import chat_template_applies, check_data_config, load_prompts
from mtpx.engine.config import resolve_compile
from mtpx.engine.llm import LLM
from mtpx.engine.threads import choose_threads, oversubscription_warning
from mtpx.io import (GracefulInterrupt, atomic_write_json, atomic_write_jsonl, atomic_write_text,
                     source_commit, utc_now)
from mtpx import schema
from mtpx.metrics.logging import RunLogger
from mtpx.metrics.report import format_report
from mtpx.metrics.stats import compute_metrics
from mtpx.evaluate.args import (cap_max_tokens, client_args, engine_args, model_path,  # noqa: F401  (API)
                                poisson_arrival_offsets, sampling_params, spec_args)
from mtpx.evaluate.generate import _generate, _output_row, _Stop, finished_rows  # noqa: F401  (API)
from mtpx.evaluate.lines import (_all_failed, _check_fixed_lengths, _client_text,  # noqa: F401  (API)
                                 _data_text, _length_text, _print_request_errors, _sampling_text,
                                 _skip_long_prompts, dead_position_warning)
from mtpx.evaluate.measure import _Run, _measure, compare_outputs  # noqa: F401  (API)


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
        raise ValueError("model.path is required with model=hf: "
                         "add model.path=DIR (a Hugging Face checkpoint folder)")
    path = model_path(cfg)
    engine = engine_args(cfg.engine)
    schema.check(mode, c)          # the client section's checks, before the model loads
    if mode == "eval" and method is not None and spec_kw.get("acceptance", "lossless") != "lossless" \
            and c.get("check_lossless"):
        raise ValueError(f"eval.check_lossless=true with spec.acceptance={spec_kw['acceptance']}: a lossy "
                         "rule is not lossless; leave eval.check_lossless null (its lossless reference then "
                         "measures the quality) or set spec.acceptance=lossless")
    num_prompts = c.get("num_prompts")
    engine["compile"] = resolve_compile(engine.get("compile"), mode, None if num_prompts is None else
                                        num_prompts * c.max_tokens)
    tree = spec_kw.get("tree")
    eager_tree = hasattr(tree, "keys") or (tree is not None and k == "auto")
    if eager_tree and engine.get("compile") and cfg.engine.get("compile") is None:
        engine["compile"] = False             # a dynamic tree, the choice of a tree run eager (docs/trees.md)
    prompts_key = f"{mode}.num_prompts"
    check_data_config(cfg.data, num_prompts, num_prompts_key=prompts_key)
    if mode == "bench" and c.get("base_url"):
        return _run_http(cfg, out_dir, c, path, num_prompts, prompts_key)
    if mode == "eval" and c.get("resume"):
        _check_resume_folder(out_dir)
    dtype = cfg.model.get("dtype") or "float32"
    llm = _load_llm(cfg, c, mode, path, method, k, dtype, engine, spec_kw)
    threads = llm.thread_choice
    name = method or "no spec"

    prompts = load_prompts(cfg.data, num_prompts, llm.tokenizer, llm.model.cfg.vocab_size,
                           num_prompts_key=prompts_key)
    chat = chat_template_applies(cfg.data, llm.tokenizer)
    if chat is False and cfg.data.get("chat_template", True):
        print(f"chat template: the tokenizer of {path} has none; {cfg.data.name} prompts are sent "
              "as the raw first-turn text (metrics.json: chat_template false)")
    _check_fixed_lengths(prompts, llm.max_model_len)
    prompts, skipped = _skip_long_prompts(prompts, llm.encode, llm.max_model_len, mode)
    client = client_args(c, len(prompts), mode)
    params = sampling_params(c, len(prompts), mode, [p.output_len for p in prompts])
    params, cap = cap_max_tokens(prompts, params, llm.max_model_len, f"{mode}.max_tokens")
    restored = _restore_rows(out_dir, mode, c, prompts, llm)
    logger = _run_logger(cfg, out_dir, mode, llm, path, method, k)
    try:
        with GracefulInterrupt() as interrupt:
            return _measure(_Run(cfg, c, mode, out_dir, llm, prompts, params, client, engine, spec_kw, chat,
                                 method, name, dtype, threads, logger, restored, cap, skipped), interrupt)
    finally:
        logger.finish()


def _load_llm(cfg: DictConfig, c: DictConfig, mode: str, path, method: str | None, k, dtype: str,
              engine: dict, spec_kw: dict) -> LLM:
    """The LLM of the model, engine and spec groups: speculator `method` (None: plain decoding)
    with k = spec.num_speculative_tokens, threads from c.threads (checked before the model loads).
    Prints the thread choice, automatic k's calibration and the compile stats."""
    spec = cfg.get("spec")
    requested = c.get("threads")
    if requested is not None:
        choose_threads(None, requested, f"{mode}.threads")   # validated and set before the model loads
    if (line := oversubscription_warning(requested, int(engine.get("tensor_parallel_size") or 1),
                                         f"{mode}.threads")) is not None:
        print(line)
    cost_file = spec.get("cost_model_file") if spec is not None and k == "auto" else None
    llm = LLM(model=path, spec=method, num_speculative_tokens=k, dtype=dtype, cost_model_file=cost_file,
              draft_path=spec.get("draft_path") if spec is not None else None,
              allow_pickle=bool(cfg.model.get("allow_pickle", False)), **engine, **spec_kw,
              threads=lambda model: choose_threads(model, requested, f"{mode}.threads"))
    print(llm.thread_choice.describe())
    if llm.calibration is not None:
        cal = llm.calibration
        print(f"num_speculative_tokens=auto: step costs {cal['source']}"
              + (f" in {cal['seconds']:.1f} s" if cal["seconds"] else ""))
    if llm.compile_stats is not None:
        cs = llm.compile_stats
        print(f"engine.compile: decode step built in {cs['compile_s']:.1f} s ({cs['num_graphs']} graphs: "
              f"{cs['num_compiled']} compiled, {cs['num_loaded']} loaded from the cache; layer regions "
              f"{'on' if cs['regions'] else 'off'}, torch.compile mode {cs['mode']})")
    return llm


def _check_resume_folder(out_dir: Path) -> None:
    """eval.resume=true: ValueError (before the model loads) when the run folder holds nothing of
    an earlier run, only what Hydra made for this one (.hydra/, the job log): a mistyped or new
    hydra.run.dir, which would silently start afresh."""
    earlier = [f.name for f in out_dir.iterdir() if f.name != ".hydra" and f.suffix != ".log"] \
        if out_dir.is_dir() else []
    if not earlier:
        raise ValueError(f"eval.resume=true: the run folder {out_dir} holds no earlier run (no "
                         "outputs.jsonl): set hydra.run.dir to the interrupted run's folder, or drop "
                         "eval.resume for a new run")


def _restore_rows(out_dir: Path, mode: str, c: DictConfig, prompts, llm: LLM) -> dict:
    """The requests of outputs.jsonl an earlier run finished, with eval.resume (printing how
    many); else outputs.jsonl is removed and nothing is restored. Creates out_dir."""
    rows_file = out_dir / "outputs.jsonl"
    rows_file.parent.mkdir(parents=True, exist_ok=True)
    restored = {}
    if mode == "eval" and c.get("resume"):
        restored = finished_rows(rows_file, prompts, llm)
        print(f"eval.resume: {len(restored)} of {len(prompts)} requests had finished in {rows_file}"
              + ("; generating the others" if len(restored) < len(prompts) else ""))
    else:
        rows_file.unlink(missing_ok=True)
    return restored


def _run_logger(cfg: DictConfig, out_dir: Path, mode: str, llm: LLM, path, method: str | None,
                k) -> RunLogger:
    """The W&B run (cfg.logger): its config is the groups this mode reads, with the architecture
    loaded, the commit and the threads; its name "METHOD-kK-DATA-MODEL[-JOB]" (k: the configured
    spec.num_speculative_tokens, "auto" or the engine's), grouped by sweep."""
    threads = llm.thread_choice
    used = {key: cfg[key]
            for key in ("mode", "seed", "data_dir", "model", "data", "engine", "spec", "logger", mode)
            if cfg.get(key) is not None}                       # the groups this mode reads
    group, job = _sweep_group()
    wandb_config = OmegaConf.to_container(OmegaConf.create(used), resolve=True)
    # the architecture loaded (the model group's YAML describes only a fresh model), commit, threads
    wandb_config["model"] = {**llm.model.cfg.to_dict(), "path": str(path)}
    wandb_config.update(commit=source_commit(), threads=threads.threads if threads else None,
                        threads_reason=threads.reason if threads else None)
    return RunLogger(OmegaConf.to_container(cfg.logger, resolve=True), run_dir=out_dir,
                     config=wandb_config, group=group,
                     run_name=f"{method or 'plain'}-k{'auto' if k == 'auto' else llm.num_speculative_tokens}"
                              f"-{cfg.data.name}-{Path(str(path)).name}"
                              + (f"-{job}" if job is not None else ""))


def _run_http(cfg: DictConfig, out_dir: Path, c: DictConfig, path, num_prompts: int | None,
              prompts_key: str) -> int:
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
    if c.get("structured_outputs") is not None:
        raise ValueError("bench.structured_outputs: the in-process engine only; unset it with bench.base_url")
    http = [HttpSampling(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
                         top_k=p.top_k if p.top_k > 0 else -1, min_p=p.min_p, seed=p.seed,
                         ignore_eos=p.ignore_eos)
            for p in params]
    t0 = time.perf_counter()
    outs = run_http_client(c.base_url, c.get("model_name"), [p.engine_input for p in prompts], http,
                           client["max_concurrency"], client["arrival_offsets"])
    duration = time.perf_counter() - t0
    _print_request_errors(outs)
    k = max((len(o.spec.accepted_per_position) for o in outs), default=0)
    metrics = compute_metrics(outs, duration, k)
    del metrics["lossless_mismatches"]
    metrics["run"] = {"mode": "bench", "base_url": c.base_url, "model": str(path),
                      "spec": None if not k else "server", "num_speculative_tokens": k, "data": cfg.data.name,
                      "num_prompts": len(prompts), "commit": source_commit(), "date": utc_now()}
    atomic_write_jsonl(out_dir / "outputs.jsonl", [_output_row(o, p) for o, p in zip(outs, prompts)])
    atomic_write_json(out_dir / "metrics.json", metrics)
    if _all_failed(outs, f"; no report (outputs.jsonl and metrics.json in {out_dir} hold the errors)"):
        return 1
    setup = _client_text(client, c)
    report = format_report(metrics, f"mtpx bench over HTTP: {c.base_url}, "
                                    f"{_data_text(cfg.data.name, prompts, None)}, {len(prompts)} prompts, "
                                    f"{_length_text(prompts, c.max_tokens)}, {_sampling_text(params[0])}, "
                                    f"{', '.join(setup)}")
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
