"""Automatic k's acceptance by age of the generation and its exploring of deeper depths
(mtpx/auto_k/acceptance.py, mtpx/auto_k/exploring.py `Exploring.depth`): exact values."""
from __future__ import annotations

import math

import pytest

from mtpx.auto_k.acceptance import AcceptanceEstimates
from mtpx.auto_k import AutoDraftLength, AutoKConfig
from mtpx.auto_k.store import save_step_costs
from tests.helpers import _params, make_llm, run_checked, spy
from tests.test_auto_k import model

# the demo's calibrated batch-16 row, eager (experiments/concurrency/kernels/eager_c16): k = 1
# costs 2.04x k = 0, so no acceptance makes k = 1 pay, while k = 4 at 3.23x pays from p ~ 0.8
C16 = [51.7421, 105.3738, 126.5949, 146.5874, 166.8934, 186.614, 209.1922, 234.1902, 254.2535]


def c16_costs() -> dict:
    return {(k, b): ms * b / 16 for b in (1, 16) for k, ms in enumerate(C16)}


def test_rounds_count_in_their_age_bucket_and_each_bucket_is_estimated_from_its_own_counts():
    e = AcceptanceEstimates(3, prior_acceptance=0.7, prior_weight=8.0, decay=1.0)
    assert [e.bucket(a) for a in (0, 7, 8, 15, 16, 31, 32, 500)] == [0, 0, 1, 1, 2, 2, 3, 3]
    e.observe(2, 1, age=3)            # young: position 1 accepted, position 2 rejected
    e.observe(3, 3, age=40)           # old: all three accepted
    e.observe(1, 1)                   # no age: engine-wide only
    assert e.age_verified[0] == [1, 1, 0] and e.age_accepted[0] == [1, 0, 0]
    assert e.age_verified[3] == [1, 1, 1] and e.age_accepted[3] == [1, 1, 1]
    assert e.verified == [3, 2, 1] and e.num_observed == [3, 2, 1]
    young, old, empty = e.by_age(0), e.by_age(3), e.by_age(1)
    assert young[0] == pytest.approx(6.6 / 9) and young[1] == pytest.approx(8 * young[0] / 9)
    assert old[0] == pytest.approx(6.6 / 9) and old[1] == pytest.approx((1 + 8 * old[0]) / 9)
    assert empty == [pytest.approx(0.7)] * 3          # a bucket no round reached holds the prior
    assert e.pooled[0] == pytest.approx((3 + 5.6) / 11)


def test_a_batch_expects_the_mean_of_its_requests_age_buckets():
    e = AcceptanceEstimates(2, decay=1.0)
    for _ in range(40):
        e.observe(2, 0, age=0)        # young requests reject every draft
        e.observe(2, 2, age=50)       # old ones accept every draft
    mix = e.mix([1, 2, 60, 70, 80, 90])
    assert mix == [2, 0, 0, 4] and e.mix([]) is None and e.mix(None) is None
    young, old = e.by_age(0), e.by_age(3)
    tokens = lambda p: 1 + p[0] + p[0] * p[1]            # noqa: E731
    assert e.expected_tokens(2, mix) == pytest.approx((2 * tokens(young) + 4 * tokens(old)) / 6)
    assert e.expected_tokens(0, mix) == 1.0
    assert e.unlearned(0, 8.0, mix) is False and e.unlearned(0, 8.0, [0, 1, 0, 0]) is True


def test_the_upper_estimate_adds_standard_deviations_of_the_beta_posterior():
    e = AcceptanceEstimates(2, decay=1.0)
    upper = 0.7 + math.sqrt(0.21 / 9)                       # no rounds: Beta(5.6, 2.4)
    assert e.expected_tokens(1, optimistic_from=0, z=1.0) == pytest.approx(1 + upper)
    assert e.expected_tokens(2, optimistic_from=1, z=1.0) == pytest.approx(1 + 0.7 + 0.7 * upper)
    assert e.expected_tokens(1, optimistic_from=0, z=3.0) == 2.0   # capped at 1


def test_exploring_skips_a_k_that_cannot_pay_to_the_depth_that_could():
    """At concurrency 16 on the demo, k = 1 never pays (2 / 105.4 < 1.05 / 51.7 even with every draft
    accepted), so exploring one position at a time never started and auto stayed at k = 0 where
    mtp4 gained 5-8% (experiments/concurrency/kernels). With every position at its upper estimate
    0.853, k = 2 is predicted 1.054x k = 0 (k = 5 1.16x): from k = 0, requests are admitted at depth
    2, the smallest depth that could pay, and probes propose 2. With k = 8 in use (the start) they
    land at 3, the smallest k within the hysteresis of k = 5, where the upper estimates pay most
    (1.13x against 1.16x k = 0; `_landing`: the cheaper k wins a tie)."""
    p = AutoDraftLength(8, c16_costs(), config=AutoKConfig(probe_interval=0, patience=2, explore_costs=False))
    assert max(range(9), key=lambda k: p.goodput(k, 16)) == 0          # at the prior 0.7: k = 0
    assert not p.exploring.could_pay(p.estimates, 0, 16, 1.0)                      # k = 1 cannot pay at p = 1
    upper = 0.7 + math.sqrt(0.21 / 9)
    gains = [(1 + sum(upper ** i for i in range(1, k + 1))) / C16[k] * C16[0] for k in range(9)]
    assert gains[1] < 1.05 < gains[2] and max(range(1, 9), key=gains.__getitem__) == 5
    assert p.exploring.depth(p.estimates, 0, 16) == 2 and p.depth(16) == 3
    assert p.exploring.depth(p.estimates, 0, 16, top=1) is None          # at most the deepest request's depth
    assert p.choose(16, 5) == 5        # the k in use (max_k, at most the deepest depth) is held: it could pay
    p.k = 0
    assert p.depth(16) == 2
    assert [p.choose(16, 5) for _ in range(2)] == [2, 2]               # from k = 0 the first step probes 2
    for _ in range(20):                                                # positions 1-2 learned: 25.6 / 28
        p.observe_round(2, 2)
    assert not p.unlearned(0) and not p.unlearned(1) and p.unlearned(2)
    assert p.exploring.depth(p.estimates, 0, 16) == 3                                 # the next depth follows
    assert AutoDraftLength(8, c16_costs(),
                           config=AutoKConfig(optimism=0.0, explore_costs=False)).depth(16) == 0


def test_old_generations_learned_apart_from_young_ones_choose_their_own_k():
    """Young rounds that reject, old ones that accept: the step's k follows the batch's mix, and
    exploring goes on while an age the batch holds is unlearned (a bucket no round reached holds
    the prior, not the young rounds' estimate)."""
    p = AutoDraftLength(8, c16_costs(),
                        config=AutoKConfig(probe_interval=0, patience=1, explore_costs=False, decay=1.0))
    for _ in range(30):
        p.observe_round(8, 0, age=2)                  # position 1 rejected: young requests verify 1 draft
    old = [40] * 16
    assert p.unlearned(0, p.estimates.mix(old)) and p.exploring.depth(p.estimates, 0, 16,
                                                                      mix=p.estimates.mix(old)) == 2
    # young: learned, and k = 0 pays
    assert p.exploring.depth(p.estimates, 0, 16, mix=p.estimates.mix([2] * 16)) is None
    for _ in range(30):
        p.observe_round(8, 8, age=40)                 # old requests accept all 8
    g_old = p._goodputs(16, 8, p.estimates.mix(old))
    assert max(range(9), key=g_old.__getitem__) == 8
    assert [p.choose(16, 8, ages=old) for _ in range(2)] == [8, 8]
    young = p.decide(16, 8, ages=[2] * 16)
    assert young.k == young.k_in_use == 0          # patience 1: a young batch switches to k = 0 at once


def test_the_scheduler_passes_each_round_its_requests_age(tmp_path, monkeypatch):
    """Every round the engine hands the policy carries the request's output tokens before it: 1
    after the prefill's token, rising by the tokens each round committed; the acceptance counts
    exactly the drafts the rounds verified (a round without drafts adds nothing). The step
    costs are measured as the engine runs, so whether it drafts depends on the machine's load."""
    costs = {(k, b): (10.0 + 4.0 * k) * (1 + 0.25 * b) for k in range(len(model().mtp) + 1) for b in (1, 4)}
    save_step_costs(tmp_path / "costs.json", costs, {})
    llm = make_llm(model(), "mtp8", "auto", max_num_seqs=4, cost_model_file=tmp_path / "costs.json")
    policy = llm.engine.draft_length
    records = spy(monkeypatch, policy, "observe")
    prompts = [[(7 * i + j) % 60 + 2 for j in range(5 + 3 * i)] for i in range(4)]
    run_checked(llm, model(), prompts, [_params(30)] * len(prompts))
    seen = [(r.num_draft_tokens, r.num_accepted, r.key, r.age) for (rec,) in records for r in rec.rounds]
    ages: dict = {}
    for num_drafts, num_accepted, key, age in seen:
        ages.setdefault(key, []).append((age, num_drafts, num_accepted))
    assert len(ages) == len(prompts)
    for rounds in ages.values():
        assert rounds[0][0] == 1
        assert all(b[0] > a[0] for a, b in zip(rounds, rounds[1:]))
    by_age = policy.summary()["acceptance_by_age"]
    assert [row["output_tokens"] for row in by_age] == ["0-7", "8-15", "16-31", "32+"]
    verified = [0] * len(model().mtp)
    for num_drafts, num_accepted, _, _ in seen:
        for j in range(min(num_accepted + 1, num_drafts)):
            verified[j] += 1
    assert policy.num_observed == verified


def test_decisions_weigh_the_ages_of_the_decode_steps_smoothed_over_steps():
    """`record` keeps the decode steps' requests per age bucket as an EMA of weight 1 - decay, and
    a decision without explicit ages weighs the estimates by it, from equal shares: a wave of young
    requests admitted together, the first included, does not swing the k (and with it the running
    depths, which never rise again)."""
    p = AutoDraftLength(8, c16_costs(),
                        config=AutoKConfig(probe_interval=0, patience=1, explore_costs=False, decay=0.9))
    assert p.age_mix is None and p._mix(None) is None
    p.record(0, 2, ages=[3, 40])                 # from equal shares: 0.9 x 0.25 + 0.1 x (1/2, 0, 0, 1/2)
    assert p.age_mix == pytest.approx([0.275, 0.225, 0.225, 0.275])
    p.record(0, 2, ages=[40, 40])
    assert p.age_mix == pytest.approx([0.2475, 0.2025, 0.2025, 0.3475])
    assert p._mix(None) == p.age_mix and p._mix([1, 9]) == [1, 1, 0, 0]
    for _ in range(30):
        p.observe_round(8, 0, age=2)
        p.observe_round(8, 8, age=40)
    # ages 8-31 unseen: explored from k = 0, and k = 8 in use (max_k) is held, since at their upper
    # estimates it could still pay
    # (for the mix: a quarter of young requests that reject everything makes k = 4 the first to pay)
    assert p.exploring.depth(p.estimates, 0, 16, mix=p.age_mix) == 4 and p.decide(16).k_in_use == 8
    p.k = 0
    assert p.decide(16).k == 4
    for _ in range(30):
        p.observe_round(8, 8, age=10)
        p.observe_round(8, 8, age=20)
    # the mix's shares (0.2475 young, 0.7525 older) weigh each bucket's own E[tokens | 8]
    alone = [p.expected_tokens(8, [float(i == b) for i in range(4)]) for b in range(4)]
    assert alone[0] < 1.2 and min(alone[1:]) > 8.3
    assert p.expected_tokens(8, p.age_mix) == pytest.approx(sum(w * t for w, t in zip(p.age_mix, alone)))
    p.k = 8
    assert p.decide(16).k == p.decide(16, ages=[40, 40]).k == 8
