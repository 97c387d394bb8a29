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
    from mtpx.metrics.pareto import _point
    assert _point(lossy, "log_likelihood_loss", None) == (1.5, 0.02, None)
    assert _point(base, "log_likelihood_loss", None) == (1.0, 0.0, None)          # the lossless rule
    assert _point(dict(lossy, quality="interrupted"), "log_likelihood_loss", None) is None
    _job(tmp_path / "plain", 0, ["spec.num_speculative_tokens=2"], base)
    assert "Speed-up" not in sweep_table(tmp_path / "plain")          # a lossless sweep: today's table
    assert write_sweep_pareto(tmp_path / "plain", collect_sweep(tmp_path / "plain")) is None


def test_tv_quality_exact():
    from mtpx.evaluate.quality import tv_quality
    rule = [[[1], [1]], [[1], [2]]]            # prompt 0: {1}, prompt 1: {1, 2}
    ref = [[[1], [2]], [[1], [2]]]
    ref2 = [[[1], [2]], [[2], [2]]]
    q = tv_quality(rule, ref, ref2, 1)
    # per prompt: tv 0.5 and 0.0; floor 0.0 and 0.5; differences 0.5 and -0.5
    assert q["tv_distance"] == 0.25 and q["tv_distance_floor"] == 0.25 and q["tv_distance_loss"] == 0.0
    half = 1.959963984540054 * math.sqrt(0.5) / math.sqrt(2)
    assert q["tv_distance_loss_interval"] == pytest.approx([-half, half]) and q["tv_num_prompts"] == 2


def _fake_run(tmp_path, **changes):
    from types import SimpleNamespace
    from omegaconf import OmegaConf
    from mtpx.core.sampling_params import SamplingParams
    from mtpx.data.prompts import Prompt
    if not (tmp_path / "ckpt").is_dir():
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"weights")
    run = dict(cfg=OmegaConf.create({"model": {"path": str(tmp_path / "ckpt")},
                                     "spec": {"num_speculative_tokens": 8}}),
               c=OmegaConf.create({"tv_num_prompts": 4, "tv_num_samples": 32, "tv_max_tokens": 8}),
               dtype="float32", threads=SimpleNamespace(threads=1), method="mtp8",
               spec_kw={"acceptance": "relaxed", "relaxed_topk": 2, "draft_sample_method": "greedy"},
               engine={"compile": True, "max_num_seqs": 64}, prompts=[Prompt("a b", "1", "gsm8k")],
               params=[SamplingParams(max_tokens=16, seed=0)], client={"max_concurrency": 1})
    run.update(changes)
    return SimpleNamespace(**run)


def test_reference_key_and_cache(tmp_path, capsys):
    """The key ignores the lossy rule's settings and changes with anything that decides the lossless
    reference; a stored reference is reused only when its tokens equal the job's lossless pass."""
    from mtpx.core.sampling_params import SamplingParams
    from mtpx.evaluate.reference import load_reference, reference_key, save_reference
    key = reference_key(_fake_run(tmp_path))
    assert key == reference_key(_fake_run(tmp_path, spec_kw={"acceptance": "typical", "posterior_alpha": 0.5,
                                                            "draft_sample_method": "greedy"}))
    for change in (dict(params=[SamplingParams(max_tokens=16, seed=1)]), dict(client={"max_concurrency": 16}),
                   dict(engine={"compile": False, "max_num_seqs": 64}), dict(dtype="bfloat16"),
                   dict(spec_kw={"acceptance": "relaxed", "draft_sample_method": "probabilistic"})):
        assert reference_key(_fake_run(tmp_path, **change)) != key, change
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"other weights")       # a new checkpoint
    assert reference_key(_fake_run(tmp_path)) != key
    folder = tmp_path / "refs"
    assert load_reference(folder, key, [[1, 2]]) is None                           # nothing stored
    save_reference(folder, key, {"tokens": [[1, 2]], "log_likelihoods": [[-0.5, -1.0]], "correct": None,
                                 "tv": None})
    stored = load_reference(folder, key, [[1, 2]])
    assert stored["log_likelihoods"] == [[-0.5, -1.0]] and stored["key"] == key
    assert load_reference(folder, key, [[1, 3]]) is None                           # stale: tokens differ
    assert "its tokens differ from this run's lossless pass" in capsys.readouterr().out


def test_rules_table_and_label():
    from mtpx.metrics.pareto import rule_label, rules_table
    assert rule_label("relaxed (relaxed_topk=2, relaxed_delta=0.05)") == "relaxed N=2 delta=0.05"
    assert rule_label("lenient (lenient_lambda=1.5)") == "lenient lambda=1.5"
    assert rule_label(None) == "lossless"
    m = {"acceptance": "lenient (lenient_lambda=2)", "acceptance_length": 3.0,
         "lossless_acceptance_length": 2.5, "output_throughput": 30.0, "output_throughput_runs": [30.0, 34.0],
         "lossless_output_throughput": 20.0,
         "speedup_vs_lossless": 1.6, "speedup_vs_lossless_runs": [1.5, 1.7],
         "quality": {"identical_share": 0.25, "tv_distance": 0.5, "tv_distance_floor": 0.4,
                     "tv_distance_loss": 0.1, "tv_distance_loss_interval": [0.05, 0.15]}}
    row = rules_table([m, {"acceptance_length": 2.0}]).splitlines()[2:]
    assert row == ["| lenient lambda=2 | 3.00, 2.50 | 32.0, 20.0 | 1.600 (1.50-1.70) | 25% | — | — | — | — "
                   "| 0.500 (0.400) | 0.100 [0.050, 0.150] |"]


@pytest.mark.slow
def test_speed_repeats_and_reused_reference(tiny_ckpt, tmp_path):
    """eval.speed_repeats=2 times each side twice; a second run with the same eval.reference_cache
    reuses the stored reference and measures the same quality."""
    over = [f"model.path={tiny_ckpt}", *BASE, "eval.speed_repeats=2",
            f"eval.reference_cache={tmp_path / 'refs'}"]
    assert run_eval(_cfg(over), tmp_path / "a") == 0
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    rule, ref = m["output_throughput_runs"], m["lossless_output_throughput_runs"]
    assert len(rule) == 2 and len(ref) == 2 and rule[0] == m["output_throughput"]
    assert m["speedup_vs_lossless"] == pytest.approx(sum(rule) / sum(ref))
    assert m["quality"]["lossless_reference"] == "computed"
    assert run_eval(_cfg(over[:-2] + [f"eval.reference_cache={tmp_path / 'refs'}"]), tmp_path / "b") == 0
    m2 = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert m2["quality"]["lossless_reference"] == "reused" and "output_throughput_runs" in m2
    keep = ("identical_share", "log_likelihood", "log_likelihood_lossless", "log_likelihood_loss")
    assert {k: m2["quality"][k] for k in keep} == {k: m["quality"][k] for k in keep}


def test_speed_repeats_must_be_positive(tiny_ckpt, tmp_path):
    with pytest.raises(ValueError, match=r"^eval.speed_repeats=0: must be an integer >= 1$"):
        run_eval(_cfg([f"model.path={tiny_ckpt}", *BASE, "eval.speed_repeats=0"]), tmp_path)
