"""mode=bench with prompts longer than the model's context (issue 73 item 7): they are skipped
with one line and counted (metrics.json num_prompts_skipped, the report's title), as vLLM's
benchmarks filter them, instead of failing as requests. And the report's ratio of speculative to
plain decoding's throughput, with a hint when speculation loses (item 8)."""
import json

import pytest

from mtpx.data.prompts import Prompt
from mtpx.evaluate.lines import _skip_long_prompts
from tests.test_bench import _cfg, _questions
from mtpx.cli import run


def test_only_bench_skips_and_all_too_long_is_one_line(capsys):
    prompts = [Prompt("a b", None, "qa"), Prompt("", None, "x", token_ids=[1] * 8),
               Prompt("a " * 9, None, "qa")]
    encode = str.split
    assert _skip_long_prompts(prompts, encode, 8, "eval") == (prompts, 0)
    assert _skip_long_prompts(prompts, encode, 8, "bench") == ([prompts[0]], 2)
    assert capsys.readouterr().out.startswith("bench: skipped 2 of 3 prompts of max_model_len=8 tokens or")
    with pytest.raises(ValueError, match=r"^bench: all 2 prompts have max_model_len=8 tokens or more: "):
        _skip_long_prompts(prompts[1:], encode, 8, "bench")


@pytest.mark.slow       # 31 s on 2 loaded cores: python -m pytest -m slow tests/test_bench_edges.py
def test_bench_skips_prompts_longer_than_max_model_len_with_a_count(tiny_ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = _questions(tmp_path / "q.jsonl", categories=("qa", "translation"), per_category=2)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    for r in rows:
        if r["category"] == "translation":
            r["turns"][0] = "word " * 200 + "?"            # past max_model_len=96 tokens
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg([f"model.path={tiny_ckpt}", "data=spec_bench", f"data.path={data}", "bench.num_prompts=4",
                "bench.max_tokens=4", "engine.max_model_len=96"])
    assert run(cfg) == 0
    out = capsys.readouterr().out
    assert ("bench: skipped 2 of 4 prompts of max_model_len=96 tokens or more (engine.max_model_len); the "
            "other 2 run (metrics.json num_prompts_skipped)") in out.splitlines()
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert (m["num_prompts_skipped"], m["num_requests"], m["num_failed"]) == (2, 2, 0)
    report = " ".join((tmp_path / "report.txt").read_text().split())
    assert "2 prompts (2 longer than max_model_len skipped)" in report


@pytest.mark.parametrize("spec,plain,line", [
    (50.0, 100.0, "0.50x"), (150.0, 100.0, "1.50x")])
def test_the_report_shows_the_speculative_to_plain_ratio_and_a_hint_when_it_loses(spec, plain, line, capsys):
    from mtpx.evaluate.measure import _speedup_lines
    from mtpx.metrics.report import format_report
    metrics = {"output_throughput": spec, "plain_output_throughput": plain, "acceptance_length": 1.4}
    _speedup_lines(metrics, {"max_concurrency": 64})
    assert metrics["speculative_speedup"] == spec / plain
    report = " ".join(format_report(metrics, "t", width=200).split())
    assert f"Speculative / plain throughput {line}" in report
    hint = ("speculation is 0.50x plain decoding at concurrency 64: verifying k drafts costs more than the "
            "1.40 tokens a step commits; try spec.num_speculative_tokens=auto")
    assert metrics.get("speedup_hint", "").startswith(hint) == (spec < plain)
    assert capsys.readouterr().out.startswith("note: " + hint) == (spec < plain)


@pytest.mark.slow       # an eval on the tiny checkpoint: python -m pytest -m slow tests/test_bench_edges.py
def test_an_eval_on_a_full_disk_writes_every_file_it_can_then_one_line(tiny_ckpt, tmp_path, monkeypatch):
    """metrics.json fails with ENOSPC: outputs.jsonl, report.txt and the figures are still
    written, and the run ends with the disk error naming metrics.json (the entry point prints
    it as one line, mtpx.io.disk_error_line)."""
    import errno
    from mtpx.evaluate import measure, run_eval
    from mtpx.io import disk_error_line
    from tests.test_cli import _cfg as eval_cfg
    real = measure.atomic_write_json

    def full(path, obj, *a, **k):
        if str(path).endswith("metrics.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, obj, *a, **k)
    monkeypatch.setattr(measure, "atomic_write_json", full)
    cfg = eval_cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=2",
                    "eval.num_prompts=2", "eval.max_tokens=6", "logger=none", "eval.check_lossless=false"])
    with pytest.raises(OSError) as err:
        run_eval(cfg, tmp_path)
    assert disk_error_line(err.value) == (f"No space left on device ({tmp_path / 'metrics.json'}): free disk "
                                          "space or point the output elsewhere")
    assert (tmp_path / "outputs.jsonl").exists() and (tmp_path / "report.txt").exists()
    assert (tmp_path / "per_position_acceptance.png").exists() and not (tmp_path / "metrics.json").exists()
