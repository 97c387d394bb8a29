"""The main job through Hydra (in-process compose): eval writes metrics.json with exactly the
documented keys, outputs.jsonl and the PNG; bad input gives one clear error line (exit code 2)."""
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from mtpx import LLM, SamplingParams
from mtpx.cli import check_overrides, run
from mtpx.evaluate import _sampling_text, poisson_arrival_offsets, run_eval, sampling_params

CONF = str(Path(__file__).resolve().parents[1] / "conf")
METRIC_KEYS = {"num_requests", "num_failed", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
               "num_committed_tokens", "acceptance_rate", "acceptance_length", "per_position_acceptance",
               "num_prompt_tokens",
               "num_cached_tokens", "prefix_cache_hit_rate", "num_preemptions", "output_throughput",
               "request_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
               "median_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms",
               "median_e2el_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_e2el_ms", "duration_s",
               "lossless_mismatches"}


def _cfg(overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=overrides)


def test_eval_writes_metrics_outputs_and_plot(tiny_ckpt, tmp_path):
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=4",
                "eval.num_prompts=5", "eval.max_tokens=12", "logger=none", "eval.concurrency=3"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    # contention_warning: written only when another process loads the CPUs during the run
    assert METRIC_KEYS <= set(metrics) and set(metrics) - METRIC_KEYS <= {"lossless_near_ties",
                                                                         "plain_output_throughput",
                                                                         "analytics", "step_costs",
                                                                         "mean_decode_batch", "run",
                                                                         "contention_warning",
                                                                         "speculative_speedup",
                                                                         "speedup_hint"}
    assert metrics["speculative_speedup"] == round(metrics["output_throughput"]
                                                   / metrics["plain_output_throughput"], 3)
    assert ("speedup_hint" in metrics) == (metrics["speculative_speedup"] < 1)
    assert metrics["run"]["spec"] == "mtp8" and metrics["run"]["num_speculative_tokens"] == 4
    assert metrics["run"]["threads"] >= 1 and metrics["run"]["data"] == "builtin"
    assert 0 < metrics["mean_decode_batch"] <= 3      # eval.concurrency=3
    assert all(int(b) <= 3 and c["verify_ms"] > 0 and c["draft_ms"] > 0
               for b, c in metrics["step_costs"].items())
    assert (tmp_path / "acceptance_conditional.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "position0_buckets.png").read_bytes()[:4] == b"\x89PNG"
    a = metrics["analytics"]  # from the per-round records (tests/test_analytics.py has exact tables)
    assert a["per_position"]["accepted"] == [round(x * metrics["num_drafts"])
                                             for x in metrics["per_position_acceptance"]]
    buckets = a["position0_buckets"]
    assert buckets["first_round"]["count"] + buckets["total"]["count"] == metrics["num_drafts"]
    assert sum(v["num_requests"] for v in a["by_category"].values()) == 5
    assert metrics["num_requests"] == 5 and metrics["num_failed"] == 0
    assert metrics["lossless_mismatches"] == 0
    assert len(metrics["per_position_acceptance"]) == 4
    assert metrics["num_draft_tokens"] > 0
    assert metrics["prefix_cache_hit_rate"] is None and metrics["num_cached_tokens"] == 0  # off
    assert metrics["num_preemptions"] == 0  # num_blocks=null: the pool never runs out
    assert 0 < metrics["median_itl_ms"] <= metrics["p99_itl_ms"]
    rows = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(5))
    assert all(set(r) >= {"index", "output_token_ids", "text", "finish_reason", "num_cached_tokens",
                          "num_preemptions", "rounds", "category"} for r in rows)
    assert sum(len(r["rounds"]) for r in rows) == metrics["num_drafts"]
    assert (tmp_path / "per_position_acceptance.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_with_prefix_caching(tiny_ckpt, tmp_path):
    """Questions sharing a long preamble, one request in flight at a time: every request after the
    first hits the blocks the earlier ones published; the outputs stay lossless."""
    preamble = "Tom has three boxes of apples and gives some of them to his friends at school. "
    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps({"question": preamble + q, "answer": "#### 1"}) + "\n"
                            for q in ["How many?", "How many are left?", "Who ate them?", "Why?"]))
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=4", "data=gsm8k",
                f"data.path={data}", "eval.num_prompts=null", "eval.max_tokens=8", "logger=none",
                "eval.concurrency=1", "engine.enable_prefix_caching=true", "engine.block_size=4"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    rate = metrics["prefix_cache_hit_rate"]
    assert isinstance(rate, float) and 0 < rate <= 1
    rows = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert rows[0]["num_cached_tokens"] == 0  # the warm-up's blocks were dropped
    assert metrics["num_cached_tokens"] == sum(r["num_cached_tokens"] for r in rows) > 0
    assert rate == metrics["num_cached_tokens"] / metrics["num_prompt_tokens"]
    assert metrics["lossless_mismatches"] == 0
    assert "Prefix cache hit rate" in (tmp_path / "report.txt").read_text()


def test_eval_with_preemption(tiny_ckpt, tmp_path):
    """A KV pool too small for all four requests at once: the engine preempts and recomputes, the
    counts reach metrics.json and outputs.jsonl, and every request still finishes losslessly."""
    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}?", "answer": f"#### {2 * i}"}) + "\n"
                            for i in range(1, 5)))
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=4", "data=gsm8k",
                f"data.path={data}", "eval.num_prompts=null", "eval.max_tokens=30", "logger=none",
                "engine.block_size=4", "engine.num_blocks=20"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    assert metrics["num_preemptions"] == sum(r["num_preemptions"] for r in rows) > 0
    assert metrics["num_failed"] == 0 and metrics["lossless_mismatches"] == 0


def test_eval_exits_1_when_every_request_fails(tiny_ckpt, tmp_path, capsys):
    """A pool too small for any request: each fails alone with an error naming engine.num_blocks,
    and the run exits 1 instead of reporting an empty success."""
    cfg = _cfg([f"model.path={tiny_ckpt}", "eval.num_prompts=3", "eval.max_tokens=30", "logger=none",
                "engine.block_size=4", "engine.num_blocks=2", "eval.check_lossless=false"])
    assert run_eval(cfg, tmp_path) == 1
    err = capsys.readouterr().err
    assert err.count("engine.num_blocks") == 3
    assert err.splitlines()[-1] == ("error: all 3 requests failed (the error lines above say why); no "
                                    "report, figures or lossless check (outputs.jsonl and metrics.json in "
                                    f"{tmp_path} hold the errors)")
    assert json.loads((tmp_path / "metrics.json").read_text())["num_failed"] == 3
    assert not (tmp_path / "report.txt").exists() and not list(tmp_path.glob("*.png"))


def test_a_spec_eval_where_every_request_fails_ends_with_one_line(tiny_ckpt, tmp_path, capsys):
    """engine.max_model_len below every prompt: each request's error, then one line; no report of
    dashes, no 'nothing to plot'."""
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=3",
                "eval.num_prompts=2", "logger=none", "engine.max_model_len=4"])
    assert run_eval(cfg, tmp_path) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["error"] * 3 and "maximum length is 4" in lines[0]
    assert lines[-1].startswith("error: all 2 requests failed (the error lines above say why)")
    assert "Acceptance" not in captured.out and "nothing to plot" not in captured.err
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert (m["num_failed"], m["lossless_mismatches"]) == (2, None) and not (tmp_path / "report.txt").exists()


def test_eval_with_request_rate(tiny_ckpt, tmp_path):
    cfg = _cfg([f"model.path={tiny_ckpt}", "eval.num_prompts=4", "eval.max_tokens=3", "logger=none",
                "eval.request_rate=20", "eval.seed=1", "eval.concurrency=null"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["num_failed"] == 0
    assert metrics["duration_s"] >= poisson_arrival_offsets(4, 20.0, 1)[-1]


def test_poisson_arrival_offsets():
    assert poisson_arrival_offsets(5, float("inf"), 0) is None
    a = poisson_arrival_offsets(20000, 4.0, 7)
    assert a == poisson_arrival_offsets(20000, 4.0, 7) != poisson_arrival_offsets(20000, 4.0, 8)
    assert len(a) == 20000 and a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    assert a[-1] / (len(a) - 1) == pytest.approx(1 / 4.0, rel=0.03)  # mean gap 1 / rate
    assert poisson_arrival_offsets(1, 4.0, 0) == [0.0] and poisson_arrival_offsets(0, 4.0, 0) == []


def test_sampled_eval_with_block_verification(tiny_ckpt, tmp_path, capsys):
    """temperature 1 with multi-module MTP and block verification: the run finishes, the lossless
    check is skipped with one line (a greedy-only check), its keys stay null, the title says how
    the run sampled, and the same seeds give the same tokens."""
    overrides = [f"model.path={tiny_ckpt}", "eval.temperature=1.0", "+spec=mtp8", "spec.verify=block",
                 "spec.num_speculative_tokens=4", "eval.num_prompts=4", "eval.max_tokens=10",
                 "logger=none", "eval.seed=3"]
    assert run_eval(_cfg(overrides), tmp_path / "a") == 0
    out = capsys.readouterr().out
    assert "lossless check skipped: it is a greedy-only check" in out
    assert "distribution tests" in out
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert METRIC_KEYS <= set(metrics) and "plain_output_throughput" not in metrics
    assert metrics["lossless_mismatches"] is None and "lossless_near_ties" not in metrics
    assert metrics["num_failed"] == 0 and metrics["num_draft_tokens"] > 0
    report = (tmp_path / "a" / "report.txt").read_text()
    assert "temperature 1" in report and "verify block" in report and "draft greedy" in report
    assert "Lossless" not in report
    assert run_eval(_cfg(overrides), tmp_path / "b") == 0
    tokens = [(tmp_path / d / "outputs.jsonl").read_text() for d in "ab"]
    assert [json.loads(x)["output_token_ids"] for x in tokens[0].splitlines()] == \
        [json.loads(x)["output_token_ids"] for x in tokens[1].splitlines()]


def test_mtp8_block_preset_is_mtp8_with_block_verification():
    block, mtp8 = _cfg(["+spec=mtp8_block"]).spec, _cfg(["+spec=mtp8"]).spec
    assert block.method == "mtp8" and block.verify == "block"
    assert dict(mtp8) == dict(block, verify="standard")
    assert _cfg(["+spec=mtp1"]).spec.draft_sample_method == "greedy"


def test_sampling_params_from_eval_config():
    e = _cfg(["eval.temperature=0.7", "eval.top_k=50", "eval.top_p=0.9", "eval.seed=5",
              "eval.max_tokens=7"]).eval
    params = sampling_params(e, 3)
    assert [p.seed for p in params] == [5, 6, 7]
    assert all((p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p) == (7, 0.7, 50, 0.9, 0.0)
               for p in params)
    assert _sampling_text(params[0]) == "temperature 0.7, top_k 50, top_p 0.9"
    default = sampling_params(_cfg([]).eval, 1)[0]
    assert default.greedy and _sampling_text(default) == "temperature 0"


def test_gsm8k_eval_scores_accuracy(tiny_ckpt, tmp_path):
    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2\\n#### 2"}\n'
                    '{"question": "2+2?", "answer": "#### 4"}\n')
    cfg = _cfg([f"model.path={tiny_ckpt}", "data=gsm8k", f"data.path={data}", "eval.num_prompts=2",
                "eval.max_tokens=4", "logger=none"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["accuracy"] == 0.0 and metrics["num_correct"] == 0
    assert metrics["lossless_mismatches"] is None


@pytest.mark.parametrize("overrides,message", [
    (["+spec=mtp8", "spec.num_speculative_tokens=9"], "only 4 MTP modules"),
    (["+spec=mtp8", "spec.method=eagle"], "unknown spec 'eagle'"),
    (["data.name=squad"], "unknown data set 'squad'"),
    (["data=gsm8k", "data.path=/nonexistent/test.jsonl"], "data.path="),
    (["mode=serv"], "mode='serv': choose one of eval, bench, train, serve, distill"),
    (["data=gsm8k", "data.num_fewshot=-1"], "data.num_fewshot=-1: must be an integer >= 0 (0 = zero-shot)"),
    (["engine.block_size=0"], "engine.block_size"),
    (["engine.block_size=abc"], "engine.block_size"),
    (["engine.num_blocks=0"], "engine.num_blocks"),
    (["engine.enable_prefix_caching=maybe"], "engine.enable_prefix_caching"),
    (["engine.max_num_seqs=0"], "engine.max_num_seqs"),
    (["engine.attention_backend=flashinfer"], "engine.attention_backend=flashinfer needs a CUDA device"),
    (["engine.attention_backend=xformers"],
     "engine.attention_backend='xformers': choose one of torch, flashinfer"),
    (["engine.max_num_batched_tokens=4"], "engine.max_num_batched_tokens"),
    (["eval.concurrency=0"], "eval.concurrency"),
    (["eval.request_rate=0"], "eval.request_rate"),
    (["eval.request_rate=fast"], "eval.request_rate"),
    (["eval.temperature=-1"], "eval.temperature=-1.0: must be a number >= 0"),
    (["eval.temperature=hot"], "eval.temperature"),
    (["eval.top_p=0"], "eval.top_p"),
    (["eval.top_k=-2"], "eval.top_k"),
    (["eval.min_p=2"], "eval.min_p"),
    (["+spec=mtp8", "spec.verify=foo"], "spec.verify='foo': choose one of standard, block"),
    (["+spec=mtp1", "spec.draft_sample_method=beam"],
     "spec.draft_sample_method='beam': choose one of greedy, probabilistic"),
])
def test_bad_input_one_clear_line(tiny_ckpt, overrides, message, capsys):
    err = entry_point_error([f"model.path={tiny_ckpt}", "logger=none", "eval.num_prompts=2"] + overrides,
                            capsys)
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def entry_point_error(argv: list[str], capsys) -> list[str]:
    """The error lines `python train_or_eval.py ARGV` prints: the checks before Hydra's main
    (mtpx.cli.check_overrides), else the run's own (exit code 2 either way)."""
    error = check_overrides(argv, Path(CONF))
    if error is not None:
        return [f"error: {error}"]
    assert run(_cfg(argv)) == 2
    return capsys.readouterr().err.strip().splitlines()


def test_malformed_data_file_names_file_and_line(tiny_ckpt, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    cfg = _cfg([f"model.path={tiny_ckpt}", "logger=none", "data=gsm8k", f"data.path={data}"])
    assert run(cfg) == 2
    assert f"{data}:2" in capsys.readouterr().err


def test_missing_checkpoint_names_the_fix(tmp_path, capsys):
    cfg = _cfg([f"model.path={tmp_path / 'nope'}", "logger=none"])
    assert run(cfg) == 2
    assert "model.path" in capsys.readouterr().err


def test_bad_prompts_fail_alone(tiny_ckpt):
    llm = LLM(model=tiny_ckpt, spec="mtp1", max_model_len=64)
    outs = llm.generate(["", "x" * 500, "def f(x):"], SamplingParams(max_tokens=5))
    assert outs[0].error.startswith("empty prompt") and outs[0].finish_reason is None
    assert "maximum length is 64" in outs[1].error
    assert outs[2].error is None and outs[2].finish_reason in ("stop", "length")
    assert len(outs[2].output_token_ids) >= 1


def test_generate_api_with_token_ids_and_strings(tiny_ckpt):
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2)
    ids = llm.encode("def f(x):")
    a, b = llm.generate(["def f(x):", ids], SamplingParams(max_tokens=6, ignore_eos=True))
    assert a.output_token_ids == b.output_token_ids and len(a.output_token_ids) == 6
    assert a.finish_reason == "length" and a.text == llm.decode(a.output_token_ids)
    assert a.spec.num_drafts >= 1 and a.prompt_token_ids == ids


@pytest.mark.parametrize("kwargs,message", [({"max_num_seqs": 0}, "max_num_seqs=0"),
                                            ({"max_model_len": 5000}, "max_model_len=5000"),
                                            ({"spec": "mtp8", "num_speculative_tokens": -1},
                                             "^spec.num_speculative_tokens=-1: give an integer >= 0, null or "
                                             "auto$")])
def test_llm_rejects_bad_engine_settings(tiny_ckpt, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(model=tiny_ckpt, **kwargs)


def test_unknown_config_group_option_is_one_line():
    from mtpx.cli import check_group_overrides
    conf = Path(CONF)
    assert check_group_overrides(["+spec=mtp8", "data=gsm8k", "eval.max_tokens=3"], conf) is None
    for name in ("spec_bench", "mt_bench", "humaneval", "random"):
        assert check_group_overrides(["mode=bench", f"data={name}", "bench.num_prompts=3"], conf) is None
    assert check_group_overrides(["bench=fast"], conf) == \
        "unknown bench config 'fast': choose one of default (bench=NAME)"
    assert check_group_overrides(["+spec=mtp9"], conf) == \
        "unknown spec 'mtp9': choose one of mtp1, mtp1_tree, mtp8, mtp8_block, mtp8_tree (+spec=NAME)"
    assert "unknown data set 'squad'" in check_group_overrides(["data=squad"], conf)
    assert check_group_overrides(["engine=vllm"], conf) == \
        "unknown engine config 'vllm': choose one of default (engine=NAME)"
    assert check_group_overrides(["engine.enable_prefix_caching=true"], conf) is None
    assert "'mtp3'" in check_group_overrides(["-m", "+spec=mtp1,mtp3"], conf)
    assert "'+spec=mtp8'" in check_group_overrides(["spec=mtp8"], conf)
    assert "+spec=mtp1 or +spec=mtp8" in check_group_overrides(["spec.num_speculative_tokens=3"], conf)
    assert check_group_overrides(["+spec=mtp8", "spec.num_speculative_tokens=3"], conf) is None


def test_model_hf_runs_a_hugging_face_folder(tiny_ckpt, tmp_path, capsys):
    """model=hf model.path=DIR on a Qwen3-Next-layout folder (exported from the tiny checkpoint),
    with model.dtype; and model=hf without a path names the fix."""
    from mtpx.hf.export import export_checkpoint
    hf = export_checkpoint(tiny_ckpt, tmp_path / "hf", "qwen3_next", num_modules=1)
    assert json.loads((hf / "config.json").read_text())["architectures"] == ["Qwen3NextForCausalLM"]
    cfg = _cfg(["model=hf", f"model.path={hf}", "model.dtype=float64", "+spec=mtp1", "logger=none",
                "eval.num_prompts=2", "eval.max_tokens=6"])
    assert run_eval(cfg, tmp_path / "run") == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_requests"] == 2 and metrics["lossless_mismatches"] == 0
    assert run(_cfg(["model=hf", "logger=none"])) == 2
    assert "model.path is required with model=hf" in capsys.readouterr().err
    assert run(_cfg(["model=hf", f"model.path={hf}", "model.dtype=float8", "logger=none"])) == 2
    assert "unknown dtype 'float8'" in capsys.readouterr().err


def test_help_lists_the_group_options_without_schemas():
    with initialize_config_dir(config_dir=CONF, version_base=None):
        text = compose("config", return_hydra_config=True).hydra.help.template
    assert "\ndata: builtin, gsm8k, humaneval, mt_bench, random, spec_bench\n" in text
    assert "\n+spec: mtp1, mtp1_tree, mtp8, mtp8_block, mtp8_tree\n" in text and "_schema" not in text


def test_a_run_that_fails_on_bad_input_leaves_no_empty_run_folder(tmp_path):
    """An error after Hydra has created the run folder (a missing checkpoint): one line, exit 2,
    and the folder (only Hydra's files and error.txt) is removed."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(root / "train_or_eval.py"), f"model.path={tmp_path / 'none'}",
                          "logger=none", f"hydra.run.dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, cwd=root, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith(
        f"error: checkpoint folder {tmp_path / 'none'} does not exist")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow      # about 24 s: a Hydra multirun of 3 jobs
def test_multirun_goes_on_after_a_failed_job(tiny_ckpt, tmp_path):
    """A job that fails (exit 2) records why in its folder (error.txt) and the sweep runs the next
    job; the sweep's exit status reports the failure."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, str(root / "train_or_eval.py"), "-m", f"model.path={tiny_ckpt}", "+spec=mtp8",
         "spec.num_speculative_tokens=9,2", "eval.num_prompts=2", "eval.max_tokens=4", "logger=none",
         f"hydra.sweep.dir={tmp_path}"],
        capture_output=True, text=True, cwd=root, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "only 4 MTP modules" in (tmp_path / "0" / "error.txt").read_text()
    assert not (tmp_path / "0" / "metrics.json").exists()
    assert json.loads((tmp_path / "1" / "metrics.json").read_text())["num_requests"] == 2
    # the sweep table at the end (Hydra callback), in the sweep folder too
    from mtpx.metrics.sweep import sweep_table
    table = (tmp_path / "sweep.md").read_text()
    assert table == sweep_table(tmp_path)
    assert res.stdout.endswith(f"\n{table}\nsweep table: {tmp_path / 'sweep.md'}\n")
    assert "2 job(s), 1 with metrics, 1 with problems." in table
    assert ("- job 0 (`spec.num_speculative_tokens=9`): failed before writing metrics.json: error: "
            "num_speculative_tokens=9 but the model has only 4 MTP modules") in table


@pytest.mark.parametrize("argv, message", [
    (["+spce=mtp8"], "unknown key 'spce': did you mean +spec=NAME (the speculator group)?"),
    (["eval.num_promts=8"], "unknown key 'eval.num_promts': did you mean eval.num_prompts?"),
    (["+eval.num_promts=8"], "unknown key 'eval.num_promts': did you mean eval.num_prompts?"),
    (["+spec=mtp8", "spec.num_speculative_tokens=2.5"],
     "spec.num_speculative_tokens=2.5: give an integer >= 0, null or auto"),
    (["+spec=mtp8", "spec.num_speculative_tokens=abc"],
     "spec.num_speculative_tokens='abc': give an integer >= 0, null or auto"),
    (["+spec=mtp8", "+spec.num_speculative_token=3"],
     "unknown key 'spec.num_speculative_token': did you mean spec.num_speculative_tokens?"),
    (["mode=train", "train.stpes=3"], "unknown key 'train.stpes': did you mean train.steps?"),
    (["model.hiden_size=64"], "unknown key 'model.hiden_size': did you mean model.hidden_size?"),
    (["engine.blok_size=4"], "unknown key 'engine.blok_size': did you mean engine.block_size?"),
    (["data=gsm8k", "data.num_fewshots=2"],
     "unknown key 'data.num_fewshots': did you mean data.num_fewshot?"),
    (["data=random", "data.input_len=ten"], "data.input_len=ten: must be an integer"),
    (["eval.check_lossless=maybe"], "eval.check_lossless=maybe: must be true or false"),
    (["eval.max_tokens=null"], "eval.max_tokens=null: must not be null"),
    (["train.data_sources=gsm8k"], "train.data_sources=gsm8k: must be a list, e.g. [a,b]"),
    (["logger=wandb", "logger.projet=x"], "unknown key 'logger.projet': did you mean logger.project?"),
    (["-m", "+spec=mtp1,mtp8", "spec.num_speculative_tokens=1,x"],
     "spec.num_speculative_tokens='x': give an integer >= 0, null or auto"),
    (["engine.compile_depths=x"], "engine.compile_depths=x: must be a list, e.g. [a,b]"),
])
def test_typos_and_wrong_types_fail_before_the_run(argv, message):
    """Structured configs (mtpx/schema/): an unknown key, with or without '+', or a value of the
    wrong type, is one line naming the key and the closest valid one; each value of a sweep is checked."""
    assert check_overrides(argv, Path(CONF)) == message


@pytest.mark.parametrize("argv", [["--cfg", "job"], ["+spec=mtp8", "-c", "job"],
                                  ["--cfg", "all", "engine.block_size=4"]])
def test_hydras_own_flags_pass_the_check(argv):
    """README's `python train_or_eval.py --cfg job`: the flag's value is Hydra's, not an override."""
    assert check_overrides(argv, Path(CONF)) is None


def test_every_group_option_composes_against_its_schema():
    """Each YAML preset matches its schema (no key missing or extra), and the values the code
    reads come through typed."""
    conf = Path(CONF)
    for group in ("data", "logger", "spec", "model", "eval", "bench", "train", "engine", "serve"):
        from mtpx.schema import group_choices
        for name in group_choices(group, conf):
            argv = [f"+{group}={name}" if group == "spec" else f"{group}={name}"]
            argv += ["model.path=/some/folder"] if (group, name) == ("model", "hf") else []
            assert check_overrides(argv, conf) is None, (group, name)
    cfg = _cfg(["+spec=mtp8", "eval.request_rate=inf", "engine.num_blocks=32"])
    assert cfg.spec.num_speculative_tokens == 8 and cfg.eval.request_rate == float("inf")
    assert cfg.engine.num_blocks == 32 and cfg.engine.compile is None and cfg.get("spec") is not None
    assert _cfg([]).get("spec") is None


def test_entry_point_prints_one_line_for_a_typo():
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(root / "train_or_eval.py"), "+eval.num_promts=8"],
                         capture_output=True, text=True, cwd=root, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: unknown key 'eval.num_promts': did you mean eval.num_prompts?"]


def test_non_finite_weights_are_named(tiny_ckpt, tmp_path):
    import shutil

    import safetensors.torch

    from mtpx.hf.loader import CheckpointError
    bad = tmp_path / "nan"
    shutil.copytree(tiny_ckpt, bad)
    tensors = safetensors.torch.load_file(str(bad / "model.safetensors"))
    tensors["mtp.2.fc.weight"][0, 0] = float("nan")
    safetensors.torch.save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError,
                       match=r"tensor 'mtp.2.fc.weight' \(mtpx mtp.2.fc.weight\) holds NaN or Inf"):
        LLM(model=bad)


def test_a_position_that_never_accepts_is_flagged():
    from mtpx.evaluate import dead_position_warning
    from mtpx.metrics.stats import SpecDecodeCounts
    assert dead_position_warning(SpecDecodeCounts(accepted_per_position=[50, 30, 0, 0])) == (
        "warning: draft position 2 (counted from 0, as in per_position_acceptance and the figures) accepted "
        "0 of the 30 drafts that reached it (position 1 accepted them): check the weights of the module "
        "that drafts it (mtp.2 with one module per position)")
    assert dead_position_warning(SpecDecodeCounts(accepted_per_position=[50, 5, 0])) is None   # too few tries
    assert dead_position_warning(SpecDecodeCounts(accepted_per_position=[50, 30, 2])) is None
    # automatic k: rounds that drafted only 2 tokens never reached position 3
    assert dead_position_warning(SpecDecodeCounts(accepted_per_position=[50, 30, 0]),
                                 rounds=[(2, 2, 3)] * 30 + [(1, 1, 2)] * 20) is None
    assert dead_position_warning(SpecDecodeCounts(accepted_per_position=[50, 30, 0]),
                                 rounds=[(3, 2, 3)] * 30 + [(1, 1, 2)] * 20).startswith(
        "warning: draft position 2 (counted from 0")


def test_k_zero_is_plain_decoding_in_a_sweep(tiny_ckpt, tmp_path):
    """spec.num_speculative_tokens=0 runs plain decoding, so a sweep over k can include it."""
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=0",
                "eval.num_prompts=2", "eval.max_tokens=4", "logger=none"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["num_drafts"] == 0 and metrics["run"]["spec"] is None
    assert metrics["run"]["num_speculative_tokens"] == 0 and "analytics" not in metrics


class _RecordingLogger:
    """Stands in for RunLogger: records what a run sends to W&B, in order."""
    calls: list = []

    def __init__(self, cfg, run_dir=None, *, run_name=None, config=None, group=None, run_id=None):
        self.run_id = run_id or "fresh-id"
        _RecordingLogger.calls.append(("init", {"run_name": run_name, "config": config, "group": group,
                                                "run_id": run_id}))

    def log(self, data, step=None):
        _RecordingLogger.calls.append(("log", data))

    def log_metrics_summary(self, metrics):
        _RecordingLogger.calls.append(("summary", metrics))

    def log_images(self, paths):
        _RecordingLogger.calls.append(("images", [p.name for p in paths]))

    def update_config(self, values):
        _RecordingLogger.calls.append(("config", values))

    def finish(self):
        _RecordingLogger.calls.append(("finish", None))


def test_wandb_run_starts_first_logs_live_and_gets_the_figures(tiny_ckpt, tmp_path, monkeypatch):
    import mtpx.evaluate as ev
    _RecordingLogger.calls = []
    monkeypatch.setattr(ev, "RunLogger", _RecordingLogger)
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=2",
                "eval.num_prompts=3", "eval.max_tokens=6", "eval.concurrency=1", "logger=wandb"])
    assert run_eval(cfg, tmp_path) == 0
    kinds = [c[0] for c in _RecordingLogger.calls]
    assert kinds[0] == "init" and kinds[-1] == "finish" and "log" in kinds
    assert kinds.index("log") < kinds.index("summary") < kinds.index("images")
    init = _RecordingLogger.calls[0][1]
    assert init["run_name"] == f"mtp8-k2-builtin-{tiny_ckpt.name}" and init["group"] is None
    assert set(init["config"]) == {"mode", "seed", "data_dir", "model", "data", "engine", "spec", "logger",
                                   "eval", "commit", "threads", "threads_reason"}
    # the W&B model config is the loaded checkpoint's architecture, not the demo YAML's
    loaded = json.loads((tiny_ckpt / "config.json").read_text())
    assert init["config"]["model"]["hidden_size"] == loaded["hidden_size"] != _cfg([]).model.hidden_size
    assert init["config"]["model"]["path"] == str(tiny_ckpt)
    assert init["config"]["threads"] == torch.get_num_threads()
    from mtpx.io import source_commit
    assert init["config"]["commit"] == source_commit()
    live = next(c[1] for c in _RecordingLogger.calls if c[0] == "log")
    assert live["live/requests_finished"] == 1 and live["live/output_tok_s"] > 0
    images = next(c[1] for c in _RecordingLogger.calls if c[0] == "images")
    assert "per_position_acceptance.png" in images


def test_resumed_training_logs_to_the_same_wandb_run(tmp_path, monkeypatch):
    import mtpx.cli as cli
    from mtpx.train import checkpoint as ckpt
    from tests.test_train import run_cfg, write_synthetic_gsm8k
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl")
    _RecordingLogger.calls = []
    monkeypatch.setattr(cli, "RunLogger", _RecordingLogger)
    train = run_cfg(tmp_path, "out", steps=2, eval_every=0)["train"]
    overrides = ["mode=train", "logger=wandb", "model.num_hidden_layers=2", "model.hidden_size=32",
                 "model.intermediate_size=64", "model.num_nextn_predict_layers=2"]
    overrides += [f"train.{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in train.items()]
    assert cli.run(_cfg(overrides)) == 0
    assert ckpt.load_trainer_state(tmp_path / "out")["wandb_run_id"] == "fresh-id"
    assert cli.run(_cfg(overrides + ["train.steps=3"])) == 0
    inits = [c[1] for c in _RecordingLogger.calls if c[0] == "init"]
    assert [i["run_id"] for i in inits] == [None, "fresh-id"] and inits[0]["run_name"] == "train-out"
    assert set(inits[0]["config"]) == {"mode", "seed", "data_dir", "model", "train", "logger", "commit"}
    configs = [c[1] for c in _RecordingLogger.calls if c[0] == "config"]
    assert len(configs) == 2 and configs[0]["model"]["hidden_size"] == 32 and configs[0]["threads"] == 1
    assert configs[0]["model"]["num_nextn_predict_layers"] == 2
    assert configs[0]["threads_reason"] == "train.threads"
    assert configs[1]["threads_reason"] == "train.threads"
    images = [c[1] for c in _RecordingLogger.calls if c[0] == "images"]
    assert images == [["loss_curve.png"], ["loss_curve.png"]]


@pytest.mark.parametrize("edit, message", [
    ({"hidden_size": "128"}, "model config hidden_size='128': must be an integer >= 1"),
    ({"hidden_size": None}, "model config hidden_size=None: must be an integer >= 1"),
    ({"num_hidden_layers": -4}, "model config num_hidden_layers=-4: must be an integer >= 1"),
    ({"layer_types": "linear_attention"}, "model config layer_types='linear_attention': must be a list"),
])
def test_bad_config_json_is_one_line_naming_the_file(tiny_ckpt, tmp_path, edit, message):
    import shutil
    folder = tmp_path / "bad"
    shutil.copytree(tiny_ckpt, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(ValueError) as e:
        LLM(model=folder)
    assert str(e.value).startswith(f"{folder / 'config.json'}: {message}") and "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError, match="is a file, not a checkpoint folder"):
        LLM(model=folder / "config.json")


def test_eval_with_automatic_k_records_the_k_per_step(tiny_ckpt, tmp_path):
    """spec.num_speculative_tokens=auto: lossless, metrics.json has the k per decode step and the
    calibrated costs, the report a row for it, and spec.cost_model_file is written for the next run."""
    costs = tmp_path / "costs.json"
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=auto",
                f"spec.cost_model_file={costs}", "eval.num_prompts=4", "eval.max_tokens=16", "logger=none",
                "eval.concurrency=2", "engine.max_num_seqs=2"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["lossless_mismatches"] == 0
    hist = metrics["k_histogram"]
    assert sum(hist.values()) > 0 and all(0 <= int(k) <= 4 for k in hist)   # the tiny model has 4 modules
    assert sorted((c["k"], c["batch_size"]) for c in metrics["auto_k"]["step_costs_ms"]) == \
        [(k, b) for k in range(5) for b in (1, 2)]
    assert costs.is_file() and "Drafts per step, k (% of steps)" in (tmp_path / "report.txt").read_text()
    # the per-request depths and the cost model against the running engine (issue 37)
    auto_k = metrics["auto_k"]
    assert sum(auto_k["depth_histogram"].values()) == 4
    assert all(0 <= int(d) <= 4 for d in auto_k["depth_histogram"])
    model = auto_k["cost_model"]
    assert set(model) <= {"1", "2-3"} and sum(r["decode_steps"] for r in model.values()) == sum(hist.values())
    compared = [r for r in model.values() if r["steps"]]
    assert compared and all(r["predicted_speedup"] > 0 and r["measured_speedup"] > 0
                            and r["measured_step_ms"] > 0
                            and r["plain_step_ms_source"] in ("measured", "calibrated") for r in compared)
    report = (tmp_path / "report.txt").read_text()
    assert "Cost model: predicted vs measured speed-up over k = 0, per batch size" in report
    assert "Draft depth per request (% of requests)" in report
    assert (tmp_path / "cost_model.png").is_file() and (tmp_path / "auto_k_histograms.png").is_file()


def test_eval_with_automatic_k_that_never_drafts_writes_its_report(tiny_ckpt, tmp_path):
    """Step costs where no draft pays (each one 100x plain): every request is admitted at depth 0
    and every step has k = 0, so nothing is drafted; the run still writes its report, its cost
    model (every compared step plain: predicted and measured speed-up 1) and figures, without the
    per-position figure it has no data for."""
    from mtpx.auto_k.store import save_step_costs
    costs = tmp_path / "costs.json"
    save_step_costs(costs, {(k, b): 1.0 + 100.0 * k for k in range(5) for b in (1, 2)}, {})
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=auto",
                f"spec.cost_model_file={costs}", "eval.num_prompts=4", "eval.max_tokens=16", "logger=none",
                "eval.concurrency=2", "engine.max_num_seqs=2"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["lossless_mismatches"] == 0 and set(metrics["k_histogram"]) == {"0"}
    assert metrics["auto_k"]["depth_histogram"] == {"0": 4}
    rows = [r for r in metrics["auto_k"]["cost_model"].values() if r["steps"]]
    assert rows and all(r["predicted_speedup"] == 1.0 and r["measured_speedup"] == 1.0
                        and r["plain_step_ms_source"] == "measured" and r["plain_steps"] == r["steps"]
                        for r in rows)
    assert (tmp_path / "cost_model.png").is_file() and not (tmp_path / "per_position_acceptance.png").exists()


def test_run_folders_end_with_the_process_id():
    """Runs started in the same second get their own folders (the slow
    tests/test_interrupt.py::test_runs_started_in_the_same_second_get_their_own_folders starts two)."""
    import os
    with initialize_config_dir(config_dir=CONF, version_base=None):
        hydra = compose("config", return_hydra_config=True).hydra
    assert hydra.run.dir.endswith(f"-{os.getpid()}") and hydra.sweep.dir.endswith(f"-{os.getpid()}")
