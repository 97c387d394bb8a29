"""A plain stretch (mtpx/auto_k/plain_stretch.py, issue 72): with the k in use settled at 0, every
running request at depth 0 and none waiting, a step decides nothing and learns k = 0's cost from
one step in settled_interval. With settled_interval 1 it leaves the policy exactly as full
decisions do; by default it skips the decision and three of four steps' cost learning."""
from __future__ import annotations

import functools

import pytest
from mtpx.auto_k import AutoDraftLength, AutoKConfig
from mtpx.auto_k.cost_curve import RunningMedian
from mtpx.core.step_plan import Candidate, Round, StepRecord, StepView
from tests.helpers import python_calls

K = 8
COSTS = {(k, b): (5 + 0.1 * b) * (1 + 0.5 * k) for k in range(K + 1) for b in (1, 4, 16, 64)}


def _policy(interval: int, enabled: bool) -> AutoDraftLength:
    p = AutoDraftLength(K, step_costs=COSTS, config=AutoKConfig(settled_interval=interval),
                        prefill_cost=0.002)
    p.plain_stretch.enabled = enabled
    for i in range(30):                  # learned acceptance: the counts the stretch's decay discounts
        p.observe_round(K, i % 5, age=i)
    return p


def _view(batch: int, removed=(), waiting=(), depth: int = 0) -> StepView:
    return StepView(batch + len(waiting), True, (depth,) * batch, tuple((i, 0) for i in range(batch)),
                    tuple(waiting), lambda d, f: True, tuple(removed))


def _record(batch: int, s: int, constant: bool = False, **kw) -> StepRecord:
    verify = 0.007 if constant else 0.007 * (1 + 0.013 * (s % 7))
    wall = verify + (0.0004 if constant else 0.0001 * (s % 5))
    return StepRecord(0, kw.pop("has_prefills", False), tuple(Round(i, 0, 0, 0, 3 * s + i, 0, 0, 1)
                                                            for i in range(batch)),
                      True, verify_s=verify, wall_s=wall, **kw)


def _stretch(p: AutoDraftLength, steps: int = 70, constant: bool = False) -> list:
    """Steps at batch 64 with every request at depth 0, four requests leaving at step 40 (probe
    steps 32 and 64 among them; constant: none leave, every step measures the same), then a step
    that admits a request: the plans."""
    plans = []
    for s in range(steps):
        batch = 64 if s < 40 or constant else 60
        plans.append(p.plan(_view(batch, removed=(60, 61, 62, 63) if s == 40 else ())))
        p.observe(_record(batch, s, constant))
    plans.append(p.plan(_view(60, waiting=(Candidate(True, 0, 50, 128),))))
    return plans


def _state(p: AutoDraftLength) -> dict:
    return {k: v for k, v in vars(p).items() if k != "plain_stretch"}


def test_with_settled_interval_1_a_plain_stretch_leaves_the_policy_as_full_decisions_do():
    """Every plan, and afterwards every part of the policy's state (acceptance counts after their
    deferred decay, cost medians, the predicted-vs-measured log, histograms, age mix, exploring
    budget, step and probe counts), equal to the full decisions', exactly."""
    fast, full = _policy(1, True), _policy(1, False)
    assert _stretch(fast) == _stretch(full)
    assert fast._probes == full._probes == 2 and fast._steps == 71
    assert _state(fast) == _state(full)
    assert fast.summary() == full.summary()


def test_a_plain_stretch_skips_the_decision_and_three_of_four_steps_cost_learning(monkeypatch):
    """Default settled_interval 4, 64 steps at batch 64: the cost medians take 6 values in each of
    the 16 learning steps (the level, k = 0's shape and raw ratio, its two parts, the overhead),
    not in all 64 (the full decisions: 384); a step that learns nothing runs a few Python calls,
    whatever the batch."""
    adds = []
    original = RunningMedian.add
    monkeypatch.setattr(RunningMedian, "add", lambda self, x, at=0: adds.append(x) or original(self, x, at))
    counts = {}
    for enabled in (True, False):
        p, adds[:] = _policy(4, enabled), []
        p.plan(_view(64))                       # the first full decision settles k = 0
        p.observe(_record(64, 0))
        adds[:] = []
        for s in range(1, 65):
            assert p.plan(_view(64)).k == 0
            p.observe(_record(64, s))
        counts[enabled] = len(adds)
    assert counts == {True: 16 * 6, False: 64 * 6}
    calls = {enabled: _calls_per_step(enabled) for enabled in (True, False)}
    skipped = [n for s, n in calls[True] if s % 4]
    assert len(skipped) == 6 and max(skipped) <= 30, calls       # full decisions: 93-154
    assert sum(n for _, n in calls[True]) < 0.5 * sum(n for _, n in calls[False]), calls


def _step(p: AutoDraftLength, view: StepView, record: StepRecord) -> None:
    p.plan(view)
    p.observe(record)


def _calls_per_step(enabled: bool) -> list[tuple[int, int]]:
    """[(step, Python calls of its plan + observe)] of steps 3-10 of a stretch at batch 64."""
    p, out = _policy(4, enabled), []
    for s in range(10):
        n = python_calls(functools.partial(_step, p, _view(64), _record(64, s)))
        if s >= 2:
            out.append((p._steps, n))
    return out


def test_steady_timings_teach_a_plain_stretch_the_costs_full_decisions_learn():
    """With the same measured step every time, the sampled medians are the full ones: the cost
    curves and the admission after the stretch agree with full decisions at settled_interval 4."""
    fast, full = _policy(4, True), _policy(4, False)
    plans = _stretch(fast, constant=True), _stretch(full, constant=True)
    assert plans[0] == plans[1] and plans[0][-1].admitted
    for b in (16, 64):
        assert fast.costs.step_cost_curve(b) == full.costs.step_cost_curve(b)
    assert fast.costs.every_k_correction.value == full.costs.every_k_correction.value != 1.0


@pytest.mark.parametrize("change", ["depth", "waiting", "forced", "k", "prefill", "catch_up"])
def test_outside_a_plain_stretch_the_full_decision_and_learning_run(change):
    """A request at depth 4, one waiting, a forced k, a k in use not yet 0: the full plan (the
    stretch ends); a step whose record holds a prefill or a lazy catch-up: the full observe."""
    p = _policy(4, True)
    p.plan(_view(16))
    p.observe(_record(16, 0))
    if change == "forced":
        p.forced = 0
    if change == "k":
        p.k = 2
    view = _view(16, depth=4) if change == "depth" else \
        _view(16, waiting=(Candidate(True, 0, 50, 128),)) if change == "waiting" else _view(16)
    p.plan(view)
    stretch = change in ("prefill", "catch_up")
    assert p.plain_stretch.active == stretch
    if stretch:
        kw = {"catch_up_module_tokens": 8, "catch_up_s": 0.001} if change == "catch_up" else \
            {"has_prefills": True}
        record = _record(16, 1, **kw)
        assert p.plain_stretch.observe(p, record) is False
