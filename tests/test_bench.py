"""mode=bench through mtpx.cli.run on the tiny checkpoint: metrics.json with the p99 latencies and
the acceptance analytics and no lossless keys, the report with the acceptance-by-category table,
chat-templated and random prompts end to end, and one clear error line for bad input."""
import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from mtpx.cli import run
from tests.test_cli import entry_point_error
from mtpx.evaluate import client_args, sampling_params
from mtpx.metrics.stats import METRIC_KEYS

CONF = str(Path(__file__).resolve().parents[1] / "conf")
P99 = ("p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms")


def _cfg(overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=["mode=bench", "logger=none"] + overrides)


def _questions(path: Path, categories=("writing", "translation", "qa"), per_category=2) -> Path:
    """A small Spec-Bench-format file: per_category questions in each category, 2 turns each."""
    lines = [json.dumps({"question_id": 81 + i, "category": c,
                         "turns": [f"Question {i} about {c}: what is x + {i}?", "And again?"]})
             for i, c in enumerate(c for _ in range(per_category) for c in categories)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "outputs.jsonl").read_text().splitlines()]


def test_bench_spec_bench_metrics_analytics_report(tiny_ckpt, tmp_path, monkeypatch, capsys):
    """Spec-Bench prompts (raw text: the tiny tokenizer has no chat template, said in one line),
    at concurrency 2; eval.check_lossless is on by default but bench never runs the plain pass."""
    monkeypatch.chdir(tmp_path)
    data = _questions(tmp_path / "q.jsonl")
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=4",
                "data=spec_bench", f"data.path={data}", "bench.num_prompts=6", "bench.max_tokens=10",
                "bench.concurrency=2"])
    assert run(cfg) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("chat template:") for line in out.splitlines()) == 1
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert set(m) == (set(METRIC_KEYS) - {"lossless_mismatches"}) | {"chat_template", "analytics",
                                                                  "step_costs", "mean_decode_batch", "run"}
    assert not any(k.startswith(("lossless", "plain_")) for k in m) and m["chat_template"] is False
    assert all(m[k] is not None for k in P99)
    assert m["median_ttft_ms"] <= m["p99_ttft_ms"] and m["median_e2el_ms"] <= m["p99_e2el_ms"]
    assert m["num_requests"] == 6 and m["num_failed"] == 0 and m["num_draft_tokens"] > 0
    by_cat = m["analytics"]["by_category"]
    assert list(by_cat) == ["mt_bench", "translation", "qa"]  # round-robin order, writing -> mt_bench
    assert all(v["num_requests"] == 2 and v["num_failed"] == 0 for v in by_cat.values())
    assert sum(v["num_drafts"] for v in by_cat.values()) == m["num_drafts"]
    rows = _rows(tmp_path)
    assert [r["category"] for r in rows] == ["mt_bench", "translation", "qa"] * 2
    assert sum(len(r["rounds"]) for r in rows) == m["num_drafts"]
    report = (tmp_path / "report.txt").read_text()
    assert report.startswith("mtpx bench: mtp8, k=4") and "spec_bench (raw text, no chat template)" in report
    for label in ("P99 TTFT (ms)", "P99 TPOT (ms)", "P99 ITL (ms)", "P99 E2EL (ms)",
                  "Request throughput (req/s)", "Per-position acceptance (%)", "Acceptance by category"):
        assert label in report, label
    assert "Lossless" not in report and report in out + "\n"


def test_bench_random_prompts_fixed_lengths(tiny_ckpt, tmp_path, monkeypatch):
    """data=random: every request has exactly input_len prompt tokens and output_len output tokens
    (ignore_eos), at a Poisson request rate, without speculation (no analytics)."""
    monkeypatch.chdir(tmp_path)
    cfg = _cfg([f"model.path={tiny_ckpt}", "data=random", "data.input_len=12", "data.output_len=7",
                "bench.num_prompts=4", "bench.request_rate=50", "bench.max_tokens=3"])
    assert run(cfg) == 0
    rows = _rows(tmp_path)
    assert [(r["num_prompt_tokens"], len(r["output_token_ids"]), r["finish_reason"], r["category"])
            for r in rows] == [(12, 7, "length", "random")] * 4
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert "analytics" not in m and "chat_template" not in m and m["num_failed"] == 0
    assert m["num_prompt_tokens"] == 48 and m["p99_tpot_ms"] is not None
    title = (tmp_path / "report.txt").read_text().split("\n\n")[0].replace("\n", " ")
    assert "random (input_len 12)" in title and "output_len 7 (ignore_eos)" in title and "50 req/s" in title


def test_bench_mt_bench_through_the_chat_template(tiny_ckpt, tmp_path, monkeypatch, capsys):
    """A checkpoint whose tokenizer has a chat template: MT-Bench's first turns are rendered with
    it and sent as ids; metrics.json says chat_template true and no fallback line is printed."""
    from mtpx.hf.tokenizer import load_hf_tokenizer
    from tests.test_hf_tokenizer import CHATML
    ckpt = tmp_path / "chat_ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                            "chat_template": CHATML}))
    monkeypatch.chdir(tmp_path)
    data = _questions(tmp_path / "mt.jsonl", categories=("writing", "math"), per_category=1)
    cfg = _cfg([f"model.path={ckpt}", "+spec=mtp1", "data=mt_bench", f"data.path={data}",
                "bench.num_prompts=null", "bench.max_tokens=5"])
    assert run(cfg) == 0
    assert "chat template:" not in capsys.readouterr().out
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["chat_template"] is True and list(m["analytics"]["by_category"]) == ["writing", "math"]
    tok = load_hf_tokenizer(ckpt)
    first = "Question 0 about writing: what is x + 0?"
    rendered = tok.apply_chat_template([{"role": "user", "content": first}])
    assert rendered.endswith("<|im_start|>assistant\n")
    assert _rows(tmp_path)[0]["num_prompt_tokens"] == len(tok.encode(rendered, add_special_tokens=False).ids)
    assert "mt_bench (chat template)" in (tmp_path / "report.txt").read_text()


def test_bench_client_and_sampling_from_the_bench_section():
    b = _cfg(["bench.temperature=0.5", "bench.seed=2", "bench.max_tokens=9", "bench.concurrency=3"]).bench
    params = sampling_params(b, 3, "bench", [None, 4, None])
    assert ([(p.max_tokens, p.ignore_eos, p.seed) for p in params]
            == [(9, False, 2), (4, True, 3), (9, False, 4)])
    assert all(p.temperature == 0.5 for p in params)
    assert client_args(b, 3, "bench") == {"max_concurrency": 3, "arrival_offsets": None}
    with pytest.raises(ValueError, match="bench.top_p=0"):
        sampling_params(_cfg(["bench.top_p=0"]).bench, 1, "bench")


@pytest.mark.parametrize("overrides,message", [
    (["bench.concurrency=0"], "bench.concurrency=0: must be an integer >= 1, or null (no limit)"),
    (["bench.request_rate=0"], "bench.request_rate=0"),
    (["bench.num_prompts=0"], "bench.num_prompts=0: must be an integer >= 1"),
    (["bench.max_tokens=0"], "bench.max_tokens=0"),
    (["bench.temperature=-1"], "bench.temperature=-1.0: must be a number >= 0"),
    (["bench.seed=-3"], "bench.seed=-3"),
    (["data=random", "data.input_len=0"], "data.input_len=0: must be an integer >= 1"),
    (["data=random", "data.output_len=-2"], "data.output_len=-2"),
    (["data=random", "bench.num_prompts=null"], "data=random has no fixed size: set bench.num_prompts=N"),
    (["data=spec_bench", "data.path=/nonexistent/question.jsonl"], "Spec-Bench file not found"),
    (["data=mt_bench", "data.path=/nonexistent/question.jsonl"], "MT-Bench file not found"),
    (["data=humaneval", "data.path=/nonexistent/HumanEval.jsonl.gz"], "HumanEval file not found"),
    (["data=spec_bench", "data.path=null"], "data.path=null: must not be null"),
    (["data=spec_bench", "data.path={questions}", "data.categories=[nope]"],
     "data.categories: {questions} has no category 'nope'"),
    (["data=mt_bench", "data.path={questions}", "data.chat_template=maybe"],
     "data.chat_template=maybe: must be true or false"),
    (["data=mt_bench", "data.path={questions}", "bench.num_prompts=50"],
     "bench.num_prompts=50: {questions} has 6 questions"),
    (["data.name=squad"], "unknown data set 'squad'"),
])
def test_bench_bad_input_one_clear_line_before_the_model_loads(overrides, message, tmp_path, capsys):
    """Each error names the key and the fix, in one line, exit code 2. model.path points nowhere:
    these errors are raised before the model would load."""
    questions = _questions(tmp_path / "q.jsonl")
    overrides = [o.replace("{questions}", str(questions)) for o in overrides]
    err = entry_point_error(["mode=bench", "logger=none", f"model.path={tmp_path / 'no_model'}",
                             "bench.num_prompts=2"]
                            + overrides, capsys)
    expected = message.replace("{questions}", str(questions))
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err


def test_bench_random_longer_than_the_model(tiny_ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = _cfg([f"model.path={tiny_ckpt}", "data=random", "data.input_len=1000", "data.output_len=100",
                "bench.num_prompts=2"])
    assert run(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.input_len=1000 + data.output_len=100 exceed the model's maximum " \
                               "length 1024" in err[0], err


def test_sigterm_during_bench_keeps_the_finished_requests(tiny_ckpt, tmp_path, monkeypatch, capsys):
    """A real SIGTERM after a few engine steps: as Ctrl-C, the finished requests, the report and
    metrics.json ("partial": true) are written, one line, exit 143."""
    import mtpx.evaluate as evaluate
    from tests.helpers import sigterm_after
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(evaluate, "GracefulInterrupt", sigterm_after(60))
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=2",
                "bench.num_prompts=16", "bench.max_tokens=24", "bench.concurrency=1"])
    assert run(cfg) == 143
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith(("interrupted", "Traceback"))]
    assert (len(lines) == 1 and lines[0].startswith("interrupted by SIGTERM: ")
            and "of 16 requests" in lines[0])
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["partial"] is True and 0 < m["num_requests"] == len(_rows(tmp_path)) < 16
    assert (tmp_path / "report.txt").exists()
