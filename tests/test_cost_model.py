"""Cost model (mtpx/auto_k/costs.py): step-cost medians, throughput prediction and the k
recommendation on synthetic costs (exact values), and the calibration the tools run."""
import pytest

from mtpx.engine.engine import StepTiming
from mtpx.auto_k.costs import predict, recommend, step_costs, tokens_per_round
from mtpx.engine.engine import measure_step_costs


def test_step_costs_take_medians_of_full_pure_decode_steps():
    t = [StepTiming(2, 8, 0, 0.0, 0.010, 0.004),
         StepTiming(2, 8, 0, 0.0, 0.030, 0.002),
         StepTiming(2, 8, 0, 0.0, 0.020, 0.006),
         StepTiming(2, 6, 0, 0.0, 0.500, 0.500),     # a request had fewer than k drafts: left out
         StepTiming(2, 8, 64, 0.1, 0.500, 0.500),    # a prefill in the step: left out
         StepTiming(1, 4, 0, 0.0, 0.008, 0.001),
         StepTiming(0, 0, 64, 0.1, 0.0, 0.0)]
    c = step_costs(t, k=4)
    assert c[2] == {"verify_ms": pytest.approx(20.0), "draft_ms": pytest.approx(4.0),
                    "step_ms": pytest.approx(26.0), "steps": 3}   # median of the sums (14, 32, 26)
    assert c[1]["step_ms"] == pytest.approx(9.0) and set(c) == {1, 2}


def test_prediction_and_recommendation():
    acc = [0.8, 0.6, 0.4, 0.2]
    assert tokens_per_round(acc, 0) == 1.0 and tokens_per_round(acc, 2) == pytest.approx(2.4)
    costs = [{"k": 0, "batch_size": 4, "verify_ms": 10.0, "draft_ms": 0.0, "step_ms": 10.0, "steps": 5},
             {"k": 2, "batch_size": 4, "verify_ms": 12.0, "draft_ms": 8.0, "step_ms": 20.0, "steps": 5},
             {"k": 4, "batch_size": 4, "verify_ms": 20.0, "draft_ms": 20.0, "step_ms": 40.0, "steps": 5},
             {"k": 8, "batch_size": 4, "verify_ms": 30.0, "draft_ms": 30.0, "step_ms": 60.0, "steps": 5},
             {"k": 2, "batch_size": 1, "verify_ms": 5.0, "draft_ms": 3.0, "step_ms": 8.0, "steps": 5}]
    p = predict(acc, costs)
    got = {(r["k"], r["batch_size"]): r["predicted_throughput"] for r in p}
    assert got == {(0, 4): pytest.approx(400.0), (2, 4): pytest.approx(4 * 2.4 / 0.020),
                   (4, 4): pytest.approx(4 * 3.0 / 0.040), (2, 1): pytest.approx(2.4 / 0.008)}
    assert recommend(p) == {1: 2, 4: 2}             # 480 tok/s at k=2 beats 400 (k=0) and 300 (k=4)
    with pytest.raises(ValueError, match="measured for 4 positions"):
        tokens_per_round(acc, 8)


def test_measure_step_costs_times_every_k_and_batch(trained_tiny):
    """The tools' calibration is automatic k's own (calibrate_step_costs on a fresh engine)."""
    rows = measure_step_costs(trained_tiny, "mtp8", batch_sizes=[3, 1], num_speculative_tokens=2,
                              rounds=2, context_len=8)
    assert [(r["k"], r["batch_size"]) for r in rows] == [(0, 1), (0, 3), (1, 1), (1, 3), (2, 1), (2, 3)]
    assert all(set(r) == {"k", "batch_size", "step_ms"} and r["step_ms"] > 0 for r in rows)


def test_step_timings_can_be_turned_off(trained_tiny):
    """record_step_timings=False: no timings (and, on CUDA, no device syncs); same tokens."""
    from mtpx import LLM, SamplingParams
    from mtpx.engine.engine import Engine
    from mtpx.spec_decode import build_speculator
    p = SamplingParams(max_tokens=12, ignore_eos=True)
    on = LLM(model=trained_tiny, spec="mtp8", num_speculative_tokens=2)
    ref = on.generate([[5, 8, 11]], p)
    assert on.engine.step_timings
    on.engine = Engine(trained_tiny, build_speculator("mtp8", trained_tiny, 2), record_step_timings=False)
    on.speculator = on.engine.speculator
    assert [o.output_token_ids for o in on.generate([[5, 8, 11]], p)] == [o.output_token_ids for o in ref]
    assert on.engine.step_timings == []
