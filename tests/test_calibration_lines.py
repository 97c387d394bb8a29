"""Automatic k's start-up calibration says what it does (issue 73 item 5): a line when it starts
and a line per pass at most every 10 s (also without a terminal); Ctrl-C or SIGTERM after the
minimum passes keeps their costs in the file (the next run loads them); a damaged step-cost cache
is measured again with one line saying so; spec.cost_model_file in a folder that does not exist
is refused with one line (a new file in an existing folder is written after calibrating, as
documented)."""
import json

import pytest

from mtpx.auto_k import calibration
from mtpx.auto_k.calibration import CalibrationInterrupted, calibrate_step_costs
from mtpx.auto_k.store import load_step_costs, save_step_costs
from tests.helpers import make_llm, peaked_model, tiny_config

MODEL = None


def model():
    global MODEL
    if MODEL is None:
        MODEL = peaked_model(tiny_config(num_hidden_layers=2, num_nextn_predict_layers=2))
    return MODEL


def _fake_measure(stop_at: int | None = None):
    calls = []

    def measure(b, ks, context_len, rounds, seed=0, draft=None):
        calls.append(b)
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        draft.update({k: [1.0] for k in ks})
        return {k: [10.0 + k + len(calls)] for k in ks}
    return measure, calls


def test_each_pass_is_reported_and_an_interrupt_after_the_minimum_passes_keeps_them():
    measure, _ = _fake_measure()
    passes = []
    calibrate_step_costs(measure, 1, 1, passes=3, spread_s=0,
                         on_pass=lambda *a: passes.append(a))
    assert passes == pytest.approx([(1, 0.023, 3, 0), (2, 0.048, 3, 0), (3, 0.075, 3, 0)])  # s of steps
    measure, _ = _fake_measure(stop_at=4)            # pass 4 of (at least) 3 interrupted
    with pytest.raises(CalibrationInterrupted) as stop:
        calibrate_step_costs(measure, 1, 1, passes=3, spread_s=100)
    assert stop.value.costs == {(0, 1): 11.0, (1, 1): 12.0}    # the least of passes 1-3
    measure, _ = _fake_measure(stop_at=2)            # pass 2 of 3: nothing to keep
    with pytest.raises(KeyboardInterrupt) as stop:
        calibrate_step_costs(measure, 1, 1, passes=3, spread_s=100)
    assert type(stop.value) is KeyboardInterrupt


def _engine(tmp_path):
    path = tmp_path / "start.json"        # a file: no start-up calibration
    save_step_costs(path, {(k, 1): 10.0 + k for k in range(len(model().mtp) + 1)}, {})
    return make_llm(model(), "mtp8", "auto", max_num_seqs=1, cost_model_file=path, check_invariants=False,
                    record_logit_gaps=False).engine


def _quick(monkeypatch, **kw):
    real = calibration.calibrate_step_costs
    monkeypatch.setattr(calibration, "calibrate_step_costs",
                        lambda *a, **k: real(*a, **{**k, "rounds": 1, "context_len": 16, **kw}))


def test_a_damaged_step_cost_cache_is_measured_again_with_one_line(tmp_path, monkeypatch):
    engine = _engine(tmp_path)
    _quick(monkeypatch, passes=1, spread_s=0)
    monkeypatch.setattr(calibration, "calibrate_prefill_cost", lambda *a, **k: 0.5)
    cache = tmp_path / "cache.json"
    cache.write_text("{not json")
    lines = []
    out = calibration.calibrate(engine.scheduler, engine.runner, engine.config, 64, None, cache, {},
                                cached=True, progress=lines.append)
    assert out["source"] == f"calibrated, saved to {cache}"
    assert lines[0].startswith(f"automatic k: the step-cost cache {cache} is damaged or stale (not a "
                               "step-cost file (Expecting property name")
    assert lines[0].endswith("); calibrating again")
    assert lines[1] == (f"automatic k: calibrating the step costs of k = 0..{len(model().mtp)} at batch "
                        f"sizes [1] (once; then kept in {cache})")
    assert len(load_step_costs(cache)[0]) == len(model().mtp) + 1


def test_an_interrupted_calibration_saves_the_passes_that_finished(tmp_path, monkeypatch):
    engine = _engine(tmp_path)
    _quick(monkeypatch, passes=1, spread_s=1e6, max_passes=5)
    real, calls = calibration.time_decode_steps, []

    def second_call_interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt        # as SIGTERM does under the CLI (mtpx.io.sigterm_as_ctrl_c)
        return real(*a, **k)
    monkeypatch.setattr(calibration, "time_decode_steps", second_call_interrupted)
    path = tmp_path / "costs.json"
    with pytest.raises(KeyboardInterrupt):
        calibration.calibrate(engine.scheduler, engine.runner, engine.config, 64, None, path,
                              {"spec": "mtp8"})
    costs, meta = load_step_costs(path)
    assert sorted(costs) == [(k, 1) for k in range(len(model().mtp) + 1)]
    assert meta["spec"] == "mtp8" and meta["prefill_module_ms_per_token"] is None
    assert json.loads(path.read_text())["draft_costs"]


def test_a_cost_model_file_in_a_missing_folder_is_one_line(tmp_path):
    path = tmp_path / "no_such_folder" / "costs.json"
    with pytest.raises(ValueError, match=rf"^spec.cost_model_file={path}: the folder {path.parent} does "
                                         r"not exist: fix the path \(a new file in an existing folder is"):
        make_llm(model(), "mtp8", "auto", max_num_seqs=1, cost_model_file=path)
