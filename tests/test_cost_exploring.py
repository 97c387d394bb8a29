"""Automatic k's cost curve: the calibration's smoothing over k, and the step costs the running
engine measures for a k it only probes (mtpx/auto_k/cost_curve.py, mtpx/auto_k/policy.py)."""
from __future__ import annotations

import random

import pytest

from mtpx.auto_k.cost_curve import StepMemo, _running_median, smooth_step_costs
from mtpx.auto_k import AutoDraftLength, AutoKConfig


def test_smoothing_keeps_the_measured_shape_and_drops_one_noisy_k():
    # the demo's raw batch-64 calibration (experiments/concurrency/explore): k = 5 read below k = 4
    raw = [220.0, 401.0, 558.0, 675.0, 811.0, 673.0, 770.0, 1026.0, 1314.0]
    assert smooth_step_costs(raw) == [220.0, 401.0, 558.0, 675.0, 675.0, 770.0, 770.0, 1026.0, 1314.0]
    # a low k = 1: Tukey's end rule, med(250, 558, 3 * 558 - 2 * 675 = 324)
    assert smooth_step_costs([220.0, 250.0, 558.0, 675.0, 811.0]) == [220.0, 324.0, 558.0, 675.0, 811.0]
    # a high k = 1 and the k = 2 it pushes up take their neighbours' level; a k >= 1 below k = 0 is
    # lifted to it
    assert smooth_step_costs([100.0, 300.0, 150.0, 160.0, 170.0]) == [100.0, 160.0, 160.0, 160.0, 170.0]
    assert smooth_step_costs([100.0, 50.0, 60.0, 70.0]) == [100.0, 100.0, 100.0, 100.0]
    # two or fewer ks with drafts: non-decreasing only (pool adjacent violators)
    assert smooth_step_costs([10.0, 14.0, 12.0]) == [10.0, 13.0, 13.0]
    # the last value stays as measured (the cost is convex in k), the inner ones are medians of 3
    assert _running_median([1.0, 2.0, 3.0, 10.0]) == [1.0, 2.0, 3.0, 10.0]
    assert _running_median([1.0, 5.0, 2.0, 3.0]) == [1.0, 2.0, 3.0, 3.0]


def policy(**kw) -> AutoDraftLength:
    """k = 0 costs 100 ms and k = 1 is calibrated at 200 ms at batch 8 (k = 2: 300). 32 rounds
    accepting the first of 2 drafts and 8 accepting none (no discount, no fading of the costs):
    p_1 = (32 + 8 * 0.7) / 48 = 0.783, p_2 = 8 p_1 / 40 = 0.157, so k = 1 yields 1.783 / 200 < 1 / 100:
    only a measured k = 1 can win."""
    p = AutoDraftLength(2, {(0, 8): 100.0, (1, 8): 200.0, (2, 8): 300.0}, AutoKConfig(
        probe_interval=0, patience=2, min_cost_observations=2, min_verified=0, hysteresis=0.05, decay=1.0,
        cost_decay=1.0, **{"explore_budget": 1.0, **kw}))
    for accepted in [1] * 32 + [0] * 8:
        p.observe_round(num_draft_tokens=2, num_accepted=accepted)
    assert p.acceptance == [pytest.approx(37.6 / 48), pytest.approx(8 * 37.6 / 48 / 40)]
    return p


def run(p, steps: int, batch: int = 8, depth: int = 2, measured=None) -> list[int]:
    """Drive `steps` decode steps: decide, commit, then report each step as the scheduler does
    (`observe_step` for a steady step, else `observe_parts`); measured(part, k) -> ms."""
    ks, held = [], p.k
    for _ in range(steps):
        choice = p.decide(batch, depth)
        p.commit(choice)
        k = choice.k
        if measured is not None:
            v, d = measured("verify", held), measured("draft", k)
            if held == k:
                p.observe_step(k, batch, v + d, verify_ms=v)
            else:
                p.costs.observe_parts(held, k, batch, v, d)
        p.record(k, batch)
        ks.append(k)
        held = k
    return ks


def corrections(table: dict) -> dict:
    """{key: (value, steps)} of a table of RunningMedians."""
    return {key: (m.value, m.count) for key, m in table.items()}


MEASURED = {("verify", 0): 60.0, ("draft", 0): 40.0, ("verify", 1): 90.0, ("draft", 1): 30.0,
            ("verify", 2): 150.0, ("draft", 2): 50.0}


def test_a_neighbour_k_whose_cost_is_only_calibrated_is_probed_until_measured():
    p = policy()
    p.settled_interval = 1              # decides every step
    p.k = 0
    assert p.exploring.cost_unlearned(1, 8) and p.exploring.cost_unlearned(0, 8)
    assert p.depth(8) == 1                          # admitted one deeper while k = 1's cost is unmeasured
    # every patience = 2 steps one step proposes k = 1 drafts, and the step after it verifies them
    assert run(p, 4, measured=lambda part, k: MEASURED[(part, k)]) == [1, 0, 1, 0]
    # k = 1's parts: verify 90 / 200 and draft 30 / 200, twice each: 0.45 + 0.15 of 200 ms
    assert corrections(p.costs.part_correction)[("verify", 1, 8)] == (pytest.approx(0.45), 2)
    assert corrections(p.costs.part_correction)[("draft", 1, 8)] == (pytest.approx(0.15), 2)
    assert not p.exploring.cost_unlearned(1, 8)
    # k = 0 too, from the probes' other halves: verify 60 / 100 and draft 40 / 100
    assert p.costs.cost_curve(8)[:2] == [pytest.approx(100.0), pytest.approx(120.0)]
    assert p.summary()["part_cost_correction"][0] == {"part": "draft", "k": 0, "batch_bucket": "8-15",
                                                      "ratio": 0.4, "steps": 2}


def test_a_k_measured_cheaper_than_calibrated_wins_and_a_dearer_one_stops_the_probes():
    p = policy()
    p.settled_interval = 1              # decides every step
    p.k = 0
    ks = run(p, 16, measured=lambda part, k: MEASURED[(part, k)])
    # k = 1 is measured after two probes; 1.783 / 120 beats 1 / 100 by more than 5%, so after
    # patience = 2 steps in a row k = 1 is in use (step 6). k = 2 takes k = 1's ratio, 0.6 x 300 =
    # 180 ms, and is not probed: even at 80% of its extra cost with every draft at position 2
    # accepted, 2.566 / 168 does not beat 1.05 x 1.783 / 120
    assert ks == [1, 0, 1, 0, 0, 1] + [1] * 10
    assert p.k == 1 and p.costs.cost_curve(8) == [pytest.approx(100.0), pytest.approx(120.0),
                                                  pytest.approx(180.0)]
    assert not p.exploring.could_pay(p.estimates, 1, 8, p.cost_share)
    dear = {**MEASURED, ("verify", 1): 180.0, ("draft", 1): 60.0}
    q = policy()
    q.settled_interval = 1              # decides every step
    q.k = 0
    # k = 1 measured at 240 ms: no more probes, and k = 2 takes k = 1's ratio, 1.2
    assert run(q, 12, measured=lambda part, k: dear[(part, k)]) == [1, 0, 1, 0] + [0] * 8
    assert q.costs.cost_curve(8) == [pytest.approx(100.0), pytest.approx(240.0), pytest.approx(360.0)]
    assert q.depth(8) == 0


def test_cost_exploring_off_probes_nothing():
    p = policy(explore_costs=False)
    p.k = 0
    assert not p.exploring.cost_unlearned(1, 8) and p.depth(8) == 0
    assert run(p, 6) == [0] * 6


def test_a_k_that_could_not_pay_at_80_percent_of_its_cost_is_not_probed():
    # k = 1 calibrated at 100x k = 0: even at 80% of its extra cost, with every draft accepted,
    # 2 / 81 < 1 / 1 (tests/test_cli.py: automatic k that never drafts)
    p = AutoDraftLength(1, {(0, 1): 1.0, (1, 1): 101.0},
                        config=AutoKConfig(probe_interval=0, patience=2, min_verified=0))
    p.settled_interval = 1              # decides every step
    p.k = 0
    assert p.exploring.cost_unlearned(1, 1) and p.depth(1) == 0
    assert run(p, 4, batch=1, depth=1) == [0] * 4
    # at 2 / (100 + 0.8 x 100) > 1.05 / 100 it is probed; at 2.2x k = 0 (the demo's batch-64 k = 1
    # after the kernels, which the running engine confirmed) 2 / 196 is not
    r = AutoDraftLength(1, {(0, 1): 100.0, (1, 1): 220.0},
                        config=AutoKConfig(probe_interval=0, min_verified=0))
    r.settled_interval = 1              # decides every step
    r.k = 0
    assert r.exploring.cost_unlearned(1, 1) and r.depth(1) == 0
    q = AutoDraftLength(1, {(0, 1): 100.0, (1, 1): 200.0},
                        config=AutoKConfig(probe_interval=0, patience=2, min_verified=0, explore_budget=1.0))
    q.settled_interval = 1              # decides every step
    q.k = 0
    assert q.depth(1) == 1 and run(q, 4, batch=1, depth=1) == [1, 0, 1, 0]


def test_the_engine_measures_a_probed_k_from_the_parts_of_its_steps(tmp_path, monkeypatch):
    """In a running engine a k whose cost is only calibrated is probed, and the scheduler hands
    the policy each pure decode step that verified one number of drafts and proposed another as
    two parts (`observe_parts`), which add up to that k's cost; the tokens stay plain decoding's.
    The clock is scripted, 1 s per reading (tests/test_auto_k.py: a step reads 2000 or 3000 ms)."""
    from mtpx.auto_k.store import save_step_costs
    from tests.helpers import _params, make_llm, run_checked, spy
    from tests.test_auto_k import model
    n = len(model().mtp)
    # k = 1 calibrated at 2x k = 0: with p = 0.7 it loses (1.7 / 2000 < 1 / 1000), but at 80% of
    # its extra cost, every draft accepted, it could pay (2 / 1800 > 1.05 / 1000): it is probed
    costs = {(k, b): 1000.0 if k == 0 else 1500.0 + 500.0 * k for k in range(n + 1) for b in (1, 2, 3, 4)}
    save_step_costs(tmp_path / "costs.json", costs, {})
    llm = make_llm(model(), "mtp8", "auto", max_num_seqs=4, cost_model_file=tmp_path / "costs.json",
                   ragged_batch=False)
    policy, clock = llm.engine.draft_length, iter(range(10 ** 6))
    policy.exploring.explore_budget = 0.01          # exploring's probes are the subject here, not its budget
    monkeypatch.setattr(llm.engine.runner, "_now", lambda: float(next(clock)))
    parts = spy(monkeypatch, policy.costs, "observe_parts")
    prompts = [[(7 * i + j) % 60 + 2 for j in range(5 + 3 * i)] for i in range(6)]
    run_checked(llm, model(), prompts, [_params(30)] * len(prompts))
    # steady steps reach it through observe_step (verified == proposed); a probe and the step after
    # it verify one k and propose another
    assert any(v != k for v, k, *_ in parts)
    # (2000: a step whose modules first caught up lazily reads the clock twice more; the catch-up's
    # own reading goes to StepTiming.catch_up_s, the other one to the draft round)
    assert all(1 <= b <= 4 and verify_ms == 2000.0 and draft_ms in (0.0, 1000.0, 2000.0)
               for v, k, b, verify_ms, draft_ms in parts)
    # the draft round is measured at the depth the step's requests hold (3 here, from exploring),
    # which a probe of k = 1 runs too
    measured = {(part, k) for part, k, _ in policy.costs.part_correction}
    assert ("verify", 1) in measured and ("draft", max(policy.depth_histogram)) in measured
    assert policy.histogram[1] > 0


def test_a_step_whose_requests_are_held_deeper_than_k_teaches_its_parts_not_ks_cost():
    """A k = 1 step whose requests hold depth 3 runs 3 modules (their catch-up): its 30 ms are not
    k = 1's cost. Only its parts are learned: verifying 1 draft, and the draft round at depth 3."""
    costs = {(k, 4): 10.0 + 5.0 * k for k in range(4)}          # t(1) = 15, t(3) = 25
    p = AutoDraftLength(3, costs)
    p.observe_step(1, 4, 30.0, verify_ms=12.0, draft_depth=3)
    assert (p.costs.bucket_correction == {} and p.costs.correction == {}
            and p.costs.every_k_correction.count == 0)
    assert corrections(p.costs.part_correction) == {("verify", 1, 4): (12.0 / 15.0, 1),
                                                    ("draft", 3, 4): (18.0 / 25.0, 1)}
    p.observe_step(1, 4, 30.0, verify_ms=12.0, draft_depth=1)   # held at k: a steady step of k = 1
    # the first k measured: its ratio is the level (`factor`), its shape the calibration's; the
    # parts are shapes over the level too
    assert (corrections(p.costs.bucket_correction) == {(1, 4): (1.0, 1)}
            and corrections(p.costs.correction) == {1: (2.0, 1)})
    assert (p.costs.factor == 2.0
            and corrections(p.costs.part_correction)[("draft", 1, 4)] == (18.0 / 15.0 / 2.0, 1))


def test_the_engine_passes_the_draft_rounds_depth_with_each_steady_step(tmp_path, monkeypatch):
    """Requests admitted at depth n while every step proposes 2 drafts: each steady step reaches
    the policy with the deepest request's depth, and k = 2 learns no whole-step cost from them."""
    from mtpx.auto_k.choices import DepthChoice, StepChoice
    from mtpx.auto_k.store import save_step_costs
    from tests.helpers import _params, make_llm, run_checked
    from tests.test_auto_k import model
    n = len(model().mtp)
    costs = {(k, b): 1000.0 + 500.0 * k for k in range(n + 1) for b in (1, 2, 3, 4)}
    save_step_costs(tmp_path / "costs.json", costs, {})
    llm = make_llm(model(), "mtp8", "auto", max_num_seqs=4, cost_model_file=tmp_path / "costs.json",
                   ragged_batch=False)
    policy = llm.engine.draft_length
    monkeypatch.setattr(policy, "decide", lambda *a, **kw: StepChoice(2))
    monkeypatch.setattr(policy, "decide_depth", lambda b, current=None, ages=None, depths=None, *_, **__:
                        DepthChoice(n if current is None else current, current))
    depths, observe_step = [], policy.observe_step
    monkeypatch.setattr(policy, "observe_step",
                        lambda *a, **kw: (depths.append(kw["draft_depth"]), observe_step(*a, **kw)))
    prompts = [[(7 * i + j) % 60 + 2 for j in range(5 + 3 * i)] for i in range(6)]
    run_checked(llm, model(), prompts, [_params(30)] * len(prompts))
    assert depths and set(depths) == {n}
    assert not any(k == 2 for k, _ in policy.costs.bucket_correction)
    assert ("draft", n) in {(part, k) for part, k, _ in policy.costs.part_correction}


def test_a_k_below_the_held_depth_pays_the_draft_round_at_that_depth():
    """Requests holding depth 4 run 4 modules at any k from 1: such a step costs its verification
    plus the depth-4 draft round. Before the parts are measured, the draft round at k is the
    calibration above plain (5 k ms here), so every k of 1-3 costs k = 4's 30 ms; a k = 0 step runs
    no module (lazy catch-up) and costs plain decoding's 10 ms plus the catch-up it defers (none
    measured: 0), so it is the step's k (4 / 10 > 2.77 x 4 / 30 at p = 0.7); without held depths
    k = 1 pays more (1.7 / 15 > 1 / 10)."""
    costs = {(k, 4): 10.0 + 5.0 * k for k in range(5)}
    p = AutoDraftLength(4, costs, config=AutoKConfig(probe_interval=0, patience=1, min_verified=0))
    assert (p.costs.held_cost_curve(4, 4) == [10.0] + [30.0] * 4
            and p.costs.held_cost_curve(4, 0) == [10.0, 15.0, 20.0, 25.0, 30.0])
    assert p.costs.held_cost_curve(4, 2) == [10.0, 20.0, 20.0, 25.0, 30.0]
    assert p.decide(4, 4, held=4).k_in_use == 0 and p.decide(4, 4).k_in_use == 1
    for _ in range(8):                                   # the depth-4 draft round measured at 12 ms
        p.costs.observe_parts(4, 4, 4, 18.0, 12.0)
    assert p.costs.draft_cost(4, 4) == pytest.approx(12.0) and p.costs.draft_cost(0, 4) == 0.0
    # k = 1: its verification (15) + the round at 4 (12) - its own at 1 (3); k = 0: 10, nothing deferred
    assert p.costs.held_cost_curve(4, 4)[:2] == pytest.approx([10.0, 24.0])


def test_a_depth_never_measured_prices_its_draft_round_per_module_of_the_measured_ones():
    """Draft rounds measured at depth 4 (12 ms, 3 ms a module) and 8 (20 ms, 2.5 ms a module):
    depth 1-3 cost 3 ms a module, 5-7 interpolate (6: 2.75 ms), and none falls back to the
    calibration above plain (5 k ms here), which priced depth 3 (15 ms) above the measured depth 4
    and made k = 3 look cheaper than k = 4 under a held depth 8."""
    costs = {(k, 4): 10.0 + 5.0 * k for k in range(9)}
    p = AutoDraftLength(8, costs, config=AutoKConfig(probe_interval=0, patience=1, min_verified=0))
    assert p.costs.draft_cost(3, 4) == pytest.approx(15.0)       # nothing measured: the calibration
    for _ in range(8):
        p.costs.observe_parts(4, 4, 4, 18.0, 12.0)
        p.costs.observe_parts(8, 8, 4, 30.0, 20.0)
    assert ([p.costs.draft_cost(k, 4) for k in range(9)]
            == pytest.approx([0, 3, 6, 9, 12, 14.375, 16.5, 18.375, 20]))
    held = p.costs.held_cost_curve(4, 8)
    assert held[3] == pytest.approx(25.0 + 20 - 9) and held[4] == pytest.approx(30.0 + 20 - 12)


def test_a_held_depth_alone_does_not_raise_the_k_in_use():
    """k in use 4, one of 4 requests held at depth 8 (explored): its catch-up makes every k of 1-7
    cost the depth-8 draft round, so k = 8 would win on the held curve (46 ms for both, 3 x E4 +
    E8 tokens against 4 x E4: 1.07x), but with nothing held k = 4 pays 1.5x more per ms, so the k
    in use stays 4. Were it raised, the next requests would be admitted at 8 and keep it there.
    Nor does it fall to k = 0, which defers the held modules' catch-up (10 ms: 0.4 tokens per ms
    against k = 4's 0.29 on the held curve, but 0.56 with nothing held)."""
    costs = {(k, 4): (10.0 if k == 0 else 24.0 if k <= 4 else 46.0) for k in range(9)}
    p = AutoDraftLength(8, costs, config=AutoKConfig(probe_interval=0, patience=1, min_verified=0))
    p.acceptance = [0.8] * 8
    p.commit(p.decide(4, 8))
    assert p.k == 4
    depths = [4, 4, 4, 8]
    g = p._goodputs(4, 8, depths=depths, curve=p.costs.held_cost_curve(4, 8))
    assert g[8] / g[4] == pytest.approx((3 * 3.3616 + 4.32891) / (4 * 3.3616), rel=1e-4)
    choice = p.decide(4, 8, held=8, depths=depths)
    assert (choice.k, choice.k_in_use) == (4, 4)


def test_an_admission_above_the_k_in_use_needs_the_batch_to_follow_or_the_evidence():
    """k in use 4, positions 1-4 learned at 0.9 and 5-8 unverified (at the chain prior, 0.9 too):
    at the means k = 8 beats 4 by 8.9% (6.13 / 44 against 4.10 / 32 tokens per ms), so an
    admission into an empty engine takes depth 8. With three requests running at 4, a step at
    8 would draft 8 for the new one alone (held curve: 0.105 against 0.114 tokens per ms), and
    with positions 5-8 at their lower estimates (0.8) 8 no longer pays by the hysteresis (5.64 /
    44 < 1.05 x 4.10 / 32), so it is admitted at 4: deeper, it would pay its modules' catch-up
    every step and no step would verify its drafts past 4. Once 5-8 are learned, 8 again."""
    costs = {(k, 4): 20.0 + 3.0 * k for k in range(9)}
    p = AutoDraftLength(8, costs, config=AutoKConfig(probe_interval=0, patience=1, explore_budget=0.0))
    for _ in range(8):                                    # the draft round: 1 ms a module
        p.costs.observe_parts(4, 4, 4, 28.0, 4.0)
    p.acceptance = [0.9] * 8
    p.estimates.verified = [100.0] * 4 + [0.0] * 4
    p.k = 4
    assert p.depth(4) == 8 and p.depth(4, depths=[]) == 8
    assert p.depth(4, depths=[4, 4, 4]) == 4
    assert p.depth(4, depths=[8, 8, 4]) == 8              # the steps would follow
    p.estimates.verified = [100.0] * 8
    assert p.depth(4, depths=[4, 4, 4]) == 8


def test_a_request_drafts_at_most_its_depth_in_the_steps_goodput():
    """15 requests at depth 0 and 1 at depth 4 (flat 100 ms costs, every draft accepted): a k step
    commits 15 x 1 + (1 + k) tokens, not 16 x (1 + k), so its goodput is (16 + k) / 100 tokens
    per ms; with every request drafting k it would be 16 (1 + k) / 100."""
    costs = {(k, 16): 100.0 for k in range(5)}
    p = AutoDraftLength(4, costs, config=AutoKConfig(probe_interval=0, patience=1, min_verified=0))
    p.acceptance = [1.0] * 4
    assert (p._goodputs(16, 4, held=4, depths=[0] * 15 + [4])
            == pytest.approx([(16 + k) / 100 for k in range(5)]))
    assert p._goodputs(16, 4, held=4) == pytest.approx([16 * (1 + k) / 100 for k in range(5)])


class _Uncached(AutoDraftLength):
    """The policy with its caches off: every cost curve and expected-token list computed anew."""

    def _memo(self):
        return StepMemo()

    def reset(self):
        super().reset()
        self.estimates._upto = _Forgetful()


class _Forgetful(dict):
    def __setitem__(self, key, value):
        pass


def _drive(p: AutoDraftLength, seed: int) -> list:
    """A seeded workload through the scheduler's calls (admissions at 1-16 running requests, falls,
    steady steps and parts, overheads, prefills, acceptance by age): every decision and the end state."""
    rng, running, trace = random.Random(seed), [], []
    for _ in range(600):
        while len(running) < (1, 4, 16)[seed % 3] and rng.random() < 0.3:
            c = p.decide_depth(len(running) + 1, depths=[d for d, _ in running],
                               prompt_tokens=rng.randint(50, 300), max_tokens=64)
            p.commit_depth(c)
            running.append([c.depth, 0])
            trace.append(c)
        if not running:
            continue
        B = len(running)
        for d in sorted({r[0] for r in running}):
            c = p.decide_depth(B, d)
            p.commit_depth(c)
            for r in running:
                r[0] = c.depth if r[0] == d else r[0]
        depths = [r[0] for r in running]
        choice = p.decide(B, max(depths), held=max(depths), depths=depths)
        p.commit(choice)
        k, ms = choice.k, (8 + 1.5 * choice.k) * (1 + 0.2 * B) * rng.uniform(0.85, 1.3)
        # asked before the learning too
        predicted = p.costs.cost(k, B), p.costs.step_cost_curve(B)[k], p.costs.held_cost_curve(B, 5)
        learn = rng.random()       # each kind of learning alone in some steps
        if learn < 0.4:
            p.observe_step(k, B, ms, num_tokens=2 * B, draft_depth=max(depths))
        elif learn < 0.8:
            p.observe_step(k, B, ms, num_tokens=2 * B, verify_ms=0.7 * ms, draft_depth=max(depths))
        else:
            p.costs.observe_parts(k, max(depths), B, 0.7 * ms, 0.3 * ms)
        if rng.random() < 0.5:
            p.costs.observe_overhead(B, rng.uniform(0.1, 0.5))
        if rng.random() < 0.05:
            p.costs.observe_prefill(rng.randint(100, 1000), rng.uniform(1, 10))
        p.record(k, B, [a for _, a in running])
        for r in running:
            n, accepted = min(k, r[0]), 0
            while accepted < n and rng.random() < 0.8:
                accepted += 1
            p.observe_round(n, accepted, None, r[1])
            r[1] += 1 + accepted
        running = [r for r in running if r[1] < 64]
        trace.append((choice, predicted, p.costs.cost_curve(B), p.costs.step_cost_curve(3 * B),
                      p.costs.held_cost_curve(B, 5)))
    return trace + [p.summary()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_cached_cost_curves_and_tokens_equal_those_computed_anew(seed):
    """The policy caches its cost curves per step (StepMemo) and its expected tokens per change of
    the counts: driven through the same seeded workload, it decides and learns exactly as with
    both caches off, float for float."""
    costs = {(k, b): (8 + 1.5 * k) * (1 + 0.2 * b * (1 + 0.3 * k)) for k in range(9) for b in (1, 4, 16)}
    runs = []
    for cls in (AutoDraftLength, _Uncached):
        p = cls(8, costs)
        p.costs.set_draft_costs({(k, b): 0.3 * k * (1 + 0.1 * b) for k in range(9) for b in (1, 4, 16)})
        p.costs.set_prefill_cost(0.01)
        runs.append(_drive(p, seed))
    assert runs[0] == runs[1]
    assert len({t[0].k for t in runs[0] if isinstance(t, tuple)}) > 1     # the k moved along the way
