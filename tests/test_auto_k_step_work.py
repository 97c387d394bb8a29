"""Automatic k's own work in a step without drafts (issue 72): the acceptance counts' per-step
decay is applied when they are next read (bit for bit the counts of decaying every step), and a
k = 0 step's `plan` and `observe` run the same Python calls at batch 64 as at batch 1 (their
per-request work is C-level list building only), forced and deciding alike."""
from __future__ import annotations

import math

import pytest
from mtpx.auto_k import AutoDraftLength
from mtpx.auto_k.acceptance import AcceptanceEstimates
from mtpx.core.step_plan import Candidate, Round, StepRecord, StepView
from tests.helpers import python_calls

K = 8


def _eager_decay(counts: list[float], f: float, steps: int) -> list[float]:
    for _ in range(steps):
        counts = [x * f for x in counts]
    return counts


def test_deferred_decay_equals_decaying_every_step_bit_for_bit():
    """Rounds observed between stretches of 1, 7 and 40 steps without any: every count (engine-wide
    and per age bucket) and every estimate equal, exactly, those of multiplying by `decay` each step
    (the reference below), and decaying alone reads no count."""
    e = AcceptanceEstimates(4, 0.7, 8.0, 0.99)
    acc, ver = [0.0] * 4, [0.0] * 4
    young_acc, young_ver = [0.0] * 4, [0.0] * 4
    for verified, accepted, quiet in [(4, 2, 1), (3, 3, 7), (2, 0, 40), (4, 4, 3)]:
        e.observe(verified, accepted, age=3)
        for j in range(verified):
            acc[j] += j < accepted
            ver[j] += 1
            young_acc[j] += j < accepted
            young_ver[j] += 1
        for _ in range(quiet):
            e.decay()
        assert e._pending == quiet                       # nothing applied yet
        acc, ver = _eager_decay(acc, 0.99, quiet), _eager_decay(ver, 0.99, quiet)
        young_acc, young_ver = _eager_decay(young_acc, 0.99, quiet), _eager_decay(young_ver, 0.99, quiet)
        assert e.accepted == acc and e.verified == ver and e._pending == 0
        assert e.age_accepted[0] == young_acc and e.age_verified[0] == young_ver
        assert e.age_verified[1] == [0.0] * 4
        assert e.pooled == e._chain(acc, ver) and e.by_age(0) == e._chain(young_acc, young_ver)
    e.decay()
    fresh = AcceptanceEstimates(4, 0.7, 8.0, 0.99)
    assert e != fresh and e.expected_tokens(4) == pytest.approx(
        1 + sum(math.prod(e.pooled[: j + 1]) for j in range(4)), abs=1e-12)


def _k0_step_calls(batch: int, forced: bool) -> int:
    """Python calls of one plan + observe of a timed k = 0 step of `batch` requests (forced: k = 0
    at depth 8; else deciding, on step costs where k = 0 pays at every batch, at depth 0), after
    50 such steps."""
    costs = {(k, b): (5 + 0.1 * b) * (1 + 0.5 * k) for k in range(K + 1) for b in (1, 4, 16, 64)}
    p = AutoDraftLength(K, step_costs=costs)
    if forced:
        p.forced, p.forced_depth = 0, K
    depth = K if forced else 0
    view = StepView(batch, True, (depth,) * batch, tuple((i, 0) for i in range(batch)), (), lambda d, f: True)

    records = [StepRecord(0, False, tuple(Round(i, 0, 0, depth, 100 + s, 0, 0, 1) for i in range(batch)),
                          True, verify_s=0.007, wall_s=0.0072) for s in range(51)]

    def step(s: int) -> None:
        assert p.plan(view).k == 0
        p.observe(records[s])
    for s in range(50):
        step(s)
    return python_calls(lambda: step(50))


@pytest.mark.parametrize("forced", [True, False])
def test_a_k0_step_s_policy_work_does_not_grow_with_the_batch(forced):
    """A step without drafts records its cost without a Python call per request: no round of it
    is observed one by one (a round without drafts teaches the acceptance nothing), and the
    acceptance decay is deferred (`test_deferred_decay_...`)."""
    calls = {b: _k0_step_calls(b, forced) for b in (1, 64)}
    assert calls[64] == calls[1], calls


# step ms at k = 0 .. 8, batch 1: a calibration of compiled-like shape (k = 8 1.26x k = 4)
ALONE = [101.58, 183.97, 199.41, 207.13, 207.18, 238.98, 257.61, 261.86, 261.86]


def _admit_alone(p: AutoDraftLength, prompt_tokens: int = 150) -> int:
    got = []
    view = StepView(1, True, (), (), (Candidate(True, 0, prompt_tokens, 256),),
                    lambda depth, freed: got.append(depth) or True)
    p.plan(view)
    return got[0]


def test_alone_an_admission_below_the_k_in_use_that_only_the_prior_predicts_waits():
    """Concurrency 1, nothing learned (every p_j the prior 0.7): k = 4 beats k = 8 on the prior
    (2.7731 tokens / 207.18 ms against 3.1988 / 261.86), but with positions 5-8 at their upper
    estimates (0.853) k = 4 does not beat k = 8 by the hysteresis, so the first request is
    admitted at the k in use, 8 (its depth can fall once positions 5-8 are learned; admitted at 4
    it could never rise). Once 200 rounds taught that a 5th draft is never accepted, a request alone is
    admitted below 8: at 5 (`_landing`: positions 6-8, never verified, at their upper estimates
    would pay there; the old rule did the same on the prior alone, at 4)."""
    costs = {(k, 1): ms for k, ms in enumerate(ALONE)}
    p = AutoDraftLength(K, step_costs=costs, prefill_cost=0.02177)
    assert p.expected_tokens(4) == pytest.approx(2.7731)
    assert p.expected_tokens(8) == pytest.approx(3.1988, abs=1e-4)
    assert p.goodput(4, 1) > 1.05 * p.goodput(8, 1)
    assert _admit_alone(p) == 8
    learned = AutoDraftLength(K, step_costs=costs, prefill_cost=0.02177)
    for _ in range(200):
        learned.observe_round(8, 4)
    assert _admit_alone(learned) == 5
