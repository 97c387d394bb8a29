"""Quality beside speed for a lossy acceptance rule (mtpx/evaluate/quality.py): the metrics exactly
on hand-made outputs, the gate, and an eval through Hydra that is marked lossy, reports its quality
and fails its gate."""
import json
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from mtpx.evaluate import run_eval
from mtpx.evaluate.quality import gate, mean_interval, token_quality, tv_distance, wilson

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def test_token_quality_exact():
    rule = [[1, 2, 3], [4, 5, 6], [7, 8]]
    ref = [[1, 2, 3], [4, 9, 6], [7, 8, 9]]           # identical, differs at 1, a prefix (differs at 2)
    ll_rule = [[-1.0] * 3, [-2.0] * 3, [-0.5] * 2]
    ll_ref = [[-1.0] * 3, [-1.0] * 3, [-0.5] * 3]
    q = token_quality(rule, ref, ll_rule, ll_ref, [True, False, True], [True, True, True])
    assert q["identical_share"] == pytest.approx(1 / 3) and q["differing_share"] == pytest.approx(2 / 3)
    assert q["mean_first_difference"] == 1.5
    assert q["log_likelihood"] == pytest.approx(-10 / 8)
    assert q["log_likelihood_lossless"] == pytest.approx(-7.5 / 9)
    assert q["log_likelihood_loss"] == pytest.approx(-7.5 / 9 + 10 / 8)
    half = 1.959963984540054 * math.sqrt(1 / 3) / math.sqrt(3)    # per-request differences 0, 1, 0
    assert q["log_likelihood_loss_interval"] == pytest.approx([1 / 3 - half, 1 / 3 + half])
    assert q["accuracy"] == pytest.approx(2 / 3) and q["accuracy_lossless"] == 1.0
    assert q["accuracy_loss"] == pytest.approx(1 / 3)
    assert q["accuracy_loss_interval"] == pytest.approx([1 / 3 - half, 1 / 3 + half])
    assert q["accuracy_interval"] == pytest.approx(list(wilson(2, 3)))


def test_wilson_and_mean_interval():
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.236593, abs=1e-6) and hi == pytest.approx(0.763407, abs=1e-6)
    assert wilson(0, 10)[0] == 0.0 and wilson(0, 0) is None
    assert mean_interval([2.0]) == (2.0, 2.0, 2.0) and mean_interval([]) is None


def test_tv_distance_exact():
    a = [[1, 2], [1, 3], [1, 2], [1, 3]]
    b = [[1, 2], [2, 2], [1, 2], [2, 2]]
    # position 0: {1: 1} vs {1: .5, 2: .5} -> 0.5; position 1: {2: .5, 3: .5} vs {2: 1} -> 0.5
    assert tv_distance(a, b, 2) == 0.5
    assert tv_distance(a, a, 2) == 0.0
    assert tv_distance([[1]], [[1, 4]], 2) == 0.5                  # an ended sample differs at position 1


def test_gate():
    q = {"acceptance": "relaxed", "accuracy_loss": 0.05, "differing_share": 0.5, "log_likelihood_loss": -0.1,
         "tv_distance_loss": None}
    assert gate(q, {"accuracy": 0.1, "differing_share": 0.5, "log_likelihood": 0.0}) is None
    line = gate(q, {"accuracy": 0.02})
    assert line.startswith("eval.max_quality_loss.accuracy=0.02 exceeded: the accuracy loss is 0.05")
    assert "not measured" in gate(q, {"tv_distance": 0.1})
    assert gate(q, {"tv_distance": None, "accuracy": None}) is None


def _cfg(overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=overrides)


BASE = ["+spec=mtp8", "spec.num_speculative_tokens=4", "eval.num_prompts=3", "eval.max_tokens=12",
        "logger=none", "eval.concurrency=3", "spec.acceptance=relaxed", "spec.relaxed_topk=300",
        "spec.relaxed_delta=1.0"]


def test_lossy_eval_reports_quality_and_fails_its_gate(tiny_ckpt, tmp_path, capsys):
    cfg = _cfg([f"model.path={tiny_ckpt}", *BASE, "eval.max_quality_loss.differing_share=0.0"])
    assert run_eval(cfg, tmp_path) == 1
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["lossy"] is True and m["acceptance"] == "relaxed (relaxed_topk=300, relaxed_delta=1.0)"
    assert "lossless_mismatches" not in m and m["acceptance_rate"] == 1.0   # every draft accepted
    q = m["quality"]
    assert q["num_requests"] == 3 and q["differing_share"] > 0 and q["log_likelihood_loss"] is not None
    assert m["speedup_vs_lossless"] == pytest.approx(m["output_throughput"] / m["lossless_output_throughput"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: eval.max_quality_loss.differing_share=0.0 exceeded")
    report = (tmp_path / "report.txt").read_text()
    assert "LOSSY" in report and "Lossless mismatches" not in report


def test_lossy_rule_refuses_the_lossless_check(tiny_ckpt, tmp_path):
    cfg = _cfg([f"model.path={tiny_ckpt}", *BASE, "eval.check_lossless=true"])
    with pytest.raises(ValueError, match=r"^eval.check_lossless=true with spec.acceptance=relaxed"):
        run_eval(cfg, tmp_path)


def _job(root: Path, num: int, overrides: list[str], metrics: dict) -> None:
    import yaml
    d = root / str(num)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (d / "metrics.json").write_text(json.dumps(metrics))


def test_pareto_front_exact():
    from mtpx.metrics.pareto import pareto_front
    # (speed-up, loss): (1, 0) lossless; (1.5, 0.1) and (2, 0.3) on the front; (1.4, 0.2) dominated
    assert pareto_front([(1.0, 0.0), (2.0, 0.3), (1.4, 0.2), (1.5, 0.1)]) == [0, 3, 1]


def test_sweep_table_and_pareto_figure_for_lossy_jobs(tmp_path):
    from mtpx.metrics.sweep import sweep_table, write_sweep_pareto, collect_sweep
    base = {"acceptance_rate": 0.5, "acceptance_length": 3.0, "per_position_acceptance": [0.6, 0.4],
            "output_throughput": 40.0}
    q = {"identical_share": 0.5, "differing_share": 0.5, "log_likelihood_loss": 0.02,
         "log_likelihood_loss_interval": [-0.01, 0.05], "accuracy": 0.5, "accuracy_lossless": 0.6,
         "accuracy_loss": 0.1, "accuracy_loss_interval": [-0.1, 0.3]}
    _job(tmp_path, 0, ["spec.acceptance=lossless"], dict(base, lossless_mismatches=0))
    rule = "relaxed (relaxed_topk=3, relaxed_delta=0.1)"
    lossy = dict(base, output_throughput=60.0, lossy=True, acceptance=rule, speedup_vs_lossless=1.5,
                 quality=q)
    _job(tmp_path, 1, ["spec.acceptance=relaxed"], lossy)
    jobs = collect_sweep(tmp_path)
    table = sweep_table(tmp_path, jobs)
    header = next(line for line in table.splitlines() if line.startswith("| spec.acceptance"))
    assert "Speed-up vs lossless" in header and "Log-likelihood loss [95% CI]" in header
    row = next(line for line in table.splitlines() if line.startswith("| relaxed"))
    assert "| 1.500 |" in row and "| 0.0200 [-0.0100, 0.0500] |" in row and "| 50.0%, 60.0% |" in row
    assert (write_sweep_pareto(tmp_path, jobs)).read_bytes()[:4] == b"\x89PNG"
    _job(tmp_path / "plain", 0, ["spec.num_speculative_tokens=2"], base)
    assert "Speed-up" not in sweep_table(tmp_path / "plain")          # a lossless sweep: today's table
    assert write_sweep_pareto(tmp_path / "plain", collect_sweep(tmp_path / "plain")) is None
