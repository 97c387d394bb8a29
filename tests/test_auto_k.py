"""num_speculative_tokens=auto (mtpx/auto_k/): the policy's arithmetic, and the
engine with a k that changes every step: lossless, every proposal equal to from-scratch drafts,
and the draft modules' KV exact after a stretch of k = 0."""
from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from mtpx import LLM, SamplingParams
from mtpx.core.request import Request
from mtpx.auto_k import AutoDraftLength, AutoKConfig
from mtpx.auto_k.calibration import calibrate_step_costs, default_batch_sizes
from mtpx.auto_k.choices import DepthChoice
from mtpx.auto_k.cost_learning import with_prefill
from mtpx.auto_k.store import check_step_cost_meta, load_step_costs, save_step_costs, step_cost_cache_path
from tests.helpers import (_params, assert_clean, install_draft_check, make_llm, peaked_model,
                           run_checked, spy, tiny_config)
from tests.test_reprefill import _reference_kv, assert_module_kv_exact, kv_at


def costs(ms_by_k: dict[int, list[float]], batches=(1, 4)) -> dict:
    return {(k, b): ms for k, row in ms_by_k.items() for b, ms in zip(batches, row)}


def step(p, batch_size: int, max_k: int | None = None) -> int:
    """One step's k as the scheduler takes it: decide, then commit."""
    choice = p.decide(batch_size, max_k)
    p.commit(choice)
    return choice.k


def lower(p, batch_size: int, current: int) -> int:
    """A running depth as the scheduler lowers it: decide_depth, then commit_depth (its vote)."""
    choice = p.decide_depth(batch_size, current)
    p.commit_depth(choice)
    return choice.depth


# ---- the policy ----------------------------------------------------------------------------------
# tests that set p.acceptance by hand pass min_verified=0, explore_costs=False: their counts are empty,
# and exploring
# unlearned positions (test_an_unlearned_position_beyond_the_k_in_use_is_explored) would probe them
def test_expected_tokens_is_the_sum_of_survival_probabilities():
    p = AutoDraftLength(3)
    p.acceptance = [0.8, 0.5, 0.25]
    assert p.expected_tokens(0) == 1.0
    assert p.expected_tokens(1) == pytest.approx(1.8)
    assert p.expected_tokens(3) == pytest.approx(1 + 0.8 + 0.4 + 0.1)


def test_step_cost_is_linear_between_batch_sizes_and_proportional_beyond():
    p = AutoDraftLength(1, costs({0: [10.0, 16.0], 1: [12.0, 30.0]}))
    assert p.costs.cost(0, 1) == 10.0 and p.costs.cost(0, 4) == 16.0
    assert p.costs.cost(0, 2) == pytest.approx(12.0)          # a third of the way from 1 to 4
    assert p.costs.cost(1, 8) == pytest.approx(60.0)          # 2x the largest batch calibrated


def test_choose_maximises_goodput_per_batch_size_with_hysteresis():
    # k = 2 costs 1.5x plain at batch 1 but 4x at batch 4
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 25.0], 2: [15.0, 40.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, hysteresis=0.05,
                                           probe_interval=0, patience=1))
    p.acceptance = [0.9, 0.9]
    assert step(p, 1) == 2                              # 2.71 / 15 beats 1.9 / 12 and 1 / 10
    assert step(p, 4) == 0                              # 1 / 10 beats 1.9 / 25 and 2.71 / 40
    p.acceptance = [0.9, 0.3]
    p.k = 2                                              # 1.9 / 12 = 0.158 vs 2.17 / 15 = 0.145:
    assert step(p, 1) == 1                              # more than 5% better: switch
    p.acceptance = [0.9, 0.56]
    assert step(p, 1) == 1                              # k=2 now 2.404 / 15 = 0.160: within 5%, stay


def test_k_rises_by_the_smaller_margin_and_falls_by_the_larger():
    """rise_hysteresis 2%, hysteresis 5%: between them the k in use stays. Goodputs at B = 1:
    k = 0 1 / 10; k = 1 (1 + p) / 18.4."""
    p = AutoDraftLength(1, costs({0: [10.0, 10.0], 1: [18.4, 18.4]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, hysteresis=0.05,
                                           rise_hysteresis=0.02, probe_interval=0, patience=1))
    p.settled_interval = 1              # decides every step
    p.acceptance = [0.9]                                 # k = 1 0.1033: 3.3% above k = 0
    assert step(p, 1, max_k=0) == 0 and step(p, 1) == 1   # rises from 0
    assert p.depth(1) == 1
    p.acceptance = [0.8]                                 # k = 0 2.2% above k = 1's 0.0978: stays
    assert step(p, 1) == 1 and p.depth(1) == 1
    p.acceptance = [0.7]                                 # 8.2% above: falls
    assert step(p, 1) == 0 and p.depth(1) == 0
    symmetric = AutoDraftLength(1, costs({0: [10.0, 10.0], 1: [18.4, 18.4]}),
                                config=AutoKConfig(min_verified=0, explore_costs=False, hysteresis=0.05,
                                                   rise_hysteresis=0.05, probe_interval=0, patience=1))
    symmetric.settled_interval = 1              # decides every step
    symmetric.acceptance = [0.9]
    assert step(symmetric, 1, max_k=0) == 0 and step(symmetric, 1) == 0 and symmetric.depth(1) == 0


def test_a_running_depth_holds_while_the_k_in_use_rises_toward_it():
    """Both need `patience` steps in a row; the depths are lowered before the step's k is chosen,
    so a depth that fell to the k in use on the same step would end the rise that would use it
    (at concurrency 1 auto stayed at k = 4 where k = 8 paid: experiments/concurrency/rise_margin)."""
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [13.0, 13.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, probe_interval=0, patience=3))
    p.acceptance = [0.9, 0.9]                           # k = 2: 2.71 / 13 beats 1.9 / 12 by 32%
    assert step(p, 1, max_k=1) == 1 and p.k == 1        # every running request at depth 1 so far
    depth = 2                                           # then one admitted at depth 2
    for _ in range(3):
        depth = lower(p, 1, depth)
        choice = p.decide(1, depth, held=depth, depths=[depth])
        p.commit(choice)
    assert (depth, choice.k, p.k) == (2, 2, 2)
    q = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [13.0, 13.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, probe_interval=0, patience=3))
    q.acceptance = [0.9, 0.2]                           # k = 2 2.08 / 13, 1.1% over k = 1: no rise
    assert step(q, 1, max_k=1) == 1
    seen, depth = [], 2
    for _ in range(3):
        seen.append(depth := lower(q, 1, depth))
        q.commit(q.decide(1, depth, held=depth, depths=[depth]))
    assert seen == [2, 2, 1] and q.k == 1               # the depth falls to the k in use


def test_depth_at_admission_changes_from_the_k_in_use_and_only_falls_by_the_hysteresis():
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 25.0], 2: [15.0, 40.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, hysteresis=0.05,
                                           probe_interval=0, patience=1))
    p.acceptance = [0.9, 0.9]
    assert p.depth(1) == 2 and p.depth(4) == 0          # the goodputs of the test above
    assert p.depth(1, current=1) == 1                   # never rises
    assert p.depth(4, current=2) == 0                   # 0.1 beats 2.71 / 40 = 0.068
    p.acceptance = [0.9, 0.56]                          # k=1: 1.9 / 12 = 0.158, k=2: 0.160
    assert p.depth(1) == 2
    p.acceptance = [0.9, 0.5]                           # k=2: 2.35 / 15 = 0.157: k=1 is best,
    assert p.depth(1) == 2 and p.depth(1, current=2) == 2   # but not by 5% over k = 2, in use
    assert step(p, 1, max_k=0) == 0 and p.k == 0       # every running request at depth 0: k = 0 in use,
    assert p.depth(1) == 1 and p.depth(4) == 0          # and k = 1's 0.158 beats its 1 / 10 by 5%
    assert step(p, 1, max_k=1) == 1 and step(p, 4, max_k=1) == 0   # a step's k <= max_k
    p.forced = 2
    assert p.depth(1) == 2 and p.depth(1, current=1) == 1
    p.forced, p.forced_depth = 0, 2                     # k = 0 steps, depths kept (the compiled warm-up)
    assert step(p, 1) == 0 and p.depth(1) == 2 and p.depth(1, current=2) == 2


def test_an_admitted_requests_module_prefill_is_spread_over_its_output_tokens():
    """Its depth's modules prefill its prompt (learned ms per prompt token and module), a cost
    added to each k's ms per token over max_tokens: deep drafts that save a little decode time
    lose to their prefill on a short answer. Goodputs at B = 1: k = 0 0.1, k = 1 1.9 / 12, k = 2
    2.71 / 15 tokens per ms."""
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 25.0], 2: [15.0, 40.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, hysteresis=0.05,
                                           probe_interval=0, patience=1))
    p.acceptance = [0.9, 0.9]
    assert p.depth(1, prompt_tokens=100, max_tokens=1) == 2      # nothing measured yet: no cost
    assert p.summary()["prefill_module_ms_per_token"] is None
    p.costs.observe_prefill(1000, 100.0)                                  # 0.1 ms per prompt token and module
    assert (p.costs.prefill_ms(2, 100) == pytest.approx(20.0)
            and p.summary()["prefill_module_ms_per_token"] == 0.1)
    assert p.depth(1) == 2 and p.depth(1, prompt_tokens=100, max_tokens=100) == 2   # 0.2 ms a token at k = 2
    # max_tokens 5: 2 ms a token per module: k = 1 1 / (12 / 1.9 + 2) = 0.120 beats
    # k = 2's 1 / (15 / 2.71 + 4)
    # = 0.105 by 15%; max_tokens 1: 10 ms per module, k = 0 (0.1) is best
    assert (p.depth(1, prompt_tokens=100, max_tokens=5) == 1
            and p.depth(1, prompt_tokens=100, max_tokens=1) == 0)
    assert p.depth(1, current=2) == 2                               # a running request's prefill is paid
    assert with_prefill([0.5, 0.25], [0.0, 2.0]) == [0.5, 1 / 6]


def test_prefill_steps_report_the_speculators_part_and_its_module_tokens(trained_tiny):
    """StepTiming of a prefill: prefill_draft_s within prefill_s, module tokens = prompt tokens x
    the modules run (each request at depth K here); plain decoding: none."""
    from mtpx import LLM, SamplingParams
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    for spec, k in (("mtp8", 3), (None, None)):
        llm = LLM(model=trained_tiny, spec=spec, num_speculative_tokens=k)
        llm.generate([[5, 8, 11, 4, 9], [3, 7]], params)
        pre = [t for t in llm.engine.step_timings if t.num_prefill_tokens]
        assert pre and all(t.num_prefill_module_tokens == (k or 0) * t.num_prefill_tokens for t in pre)
        assert all(0 <= t.prefill_draft_s <= t.prefill_s for t in pre) and (spec is None) == all(
            t.prefill_draft_s == 0 for t in pre)


def test_the_k_in_use_and_a_running_depth_change_after_patience_steps_in_a_row():
    """A few steps' estimates (a request's first rounds accept less than the rest) switch
    nothing: the k in use changes, and running requests' depths fall, only after `patience`
    consecutive decode steps predict it; a step that does not resets the count; a depth is voted
    once per step whatever the number of requests at it."""
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 25.0], 2: [15.0, 40.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, hysteresis=0.05,
                                           probe_interval=0, patience=3))
    p.settled_interval = 1              # decides every step
    p.acceptance = [0.9, 0.9]
    assert [step(p, 1) for _ in range(2)] == [2, 2]     # k = 2 in use (max_k at the start)
    p.acceptance = [0.1, 0.1]                            # now 1 / 10 beats 1.19 / 15 by far
    assert [step(p, 1) for _ in range(2)] == [2, 2]
    p.acceptance = [0.9, 0.9]                            # one step that does not: the count restarts
    assert step(p, 1) == 2
    p.acceptance = [0.1, 0.1]
    assert [step(p, 1) for _ in range(3)] == [2, 2, 0]  # the third step in a row switches
    # running requests at depth 2: the scheduler asks once per step and depth, several times here
    p.acceptance = [0.9, 0.9]
    step(p, 1)
    p.acceptance = [0.1, 0.1]
    falls = []
    for _ in range(3):
        step(p, 1)                                      # a new step
        falls.append([lower(p, 1, 2) for _ in range(4)])
    assert falls == [[2] * 4, [2] * 4, [0] * 4]
    p.acceptance, p.k = [0.9, 0.9], 2                    # k = 2 in use and paying again:
    assert p.depth(1, current=2) == 2                    # not predicted any more, the count resets


def test_a_running_depth_above_the_k_in_use_falls_to_it_after_patience_steps():
    """Modules beyond the k in use only catch up (a step drafts min(k, depth)): a running depth
    above the k in use falls to it after `patience` steps in a row, even where its own goodput
    ties the k in use's (no hysteresis margin to beat); one at or below it stays."""
    p = AutoDraftLength(3, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [14.0, 14.0], 3: [16.0, 16.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, hysteresis=0.05,
                                           probe_interval=0, patience=2))
    p.acceptance = [0.9, 0.9, 0.3]                       # k=2: 2.71 / 14 = 0.194; k=3: 2.953 / 16 = 0.185
    assert [step(p, 1) for _ in range(3)] == [3, 3, 3]  # within 5% of each other: k = 3 (max_k) stays
    assert p.depth(1, current=3) == 3
    p.k = 2                                              # the k in use became 2 (say, by a probe's estimates)
    assert step(p, 1) == 2
    assert [lower(p, 1, 3)] == [3]                       # one step: a streak of 1
    step(p, 1)
    assert lower(p, 1, 3) == 2                           # the second in a row: down to the k in use
    assert p.depth(1, current=2) == 2 and p.depth(1, current=1) == 1   # never rises


def test_probes_one_draft_more_then_one_fewer_every_probe_interval():
    p = AutoDraftLength(2, costs({0: [1.0, 1.0], 1: [5.0, 5.0], 2: [9.0, 9.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, probe_interval=4, patience=1))
    p.acceptance = [0.5, 0.5]
    assert [step(p, 1) for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 0]     # no k below 0
    p = AutoDraftLength(2, costs({0: [9.0, 9.0], 1: [9.0, 9.0], 2: [9.0, 9.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, probe_interval=2, patience=1))
    assert [step(p, 1) for _ in range(4)] == [2, 2, 2, 1]                 # no k above max_k


def test_queries_do_not_change_the_policy_and_commit_applies_exactly_what_decide_returned():
    """choose / depth / decide / decide_depth are queries: asked any number of times they answer
    the same and change nothing; commit and commit_depth apply the decision (mtpx/auto_k/policy.py)."""
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 25.0], 2: [15.0, 40.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, hysteresis=0.05,
                                           probe_interval=2, patience=2, patient_start=True))
    p.acceptance = [0.1, 0.1]                            # k = 0 pays: a switch from k = 2 is predicted
    state = copy.deepcopy(vars(p))
    assert [p.choose(1) for _ in range(5)] == [2] * 5 and [p.depth(1, current=2) for _ in range(5)] == [2] * 5
    assert p.decide(1) == p.decide(1) and p.decide_depth(1, 2) == p.decide_depth(1, 2)
    assert vars(p) == state
    # step 1: a streak of 1; step 2 switches the k in use to 0 and probes one above it; step 3: 0
    assert [step(p, 1) for _ in range(3)] == [2, 1, 0] and p.k == 0 and p._steps == 3
    assert [lower(p, 1, 2) for _ in range(3)] == [2, 2, 2]   # one vote this step, however often asked
    step(p, 1)
    assert lower(p, 1, 2) == 0                           # the second step in a row


def test_measured_step_costs_correct_the_calibration_by_one_factor():
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [14.0, 14.0]}),
                        config=AutoKConfig(cost_window=3, probe_interval=0))
    p.acceptance = [0.9, 0.9]
    assert step(p, 1) == 2                              # 2.71 / 14 beats 1.9 / 12
    p.observe_step(2, 1, 28.0)                           # k = 2 really costs twice the calibration
    assert p.summary()["cost_correction"] == {"2": 2.0} and p.costs.factor == 2.0
    assert p.costs.cost(2, 1) == 28.0 and p.costs.cost(0, 1) == 20.0     # every k: one factor
    p.observe_step(1, 1, 12.0)                           # the median of 2 and 1
    assert (p.summary()["cost_correction"] == {"1": 1.0, "2": 2.0} and p.costs.factor == 1.5
            and p.costs.cost(1, 1) == 18.0)
    assert step(p, 1) == 2                              # the calibration's ratios decide


def test_a_streak_of_dear_steps_does_not_carry_the_cost_correction():
    """A correction is the median of its last cost_window steps: a streak of dear steps shorter
    than half the window leaves it at the ordinary steps' level, and a lasting change moves it
    once it fills half the window (experiments/concurrency/window_layout/k7_steps.py: a running
    engine's dear steps come in streaks)."""
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [16.0, 16.0]}),
                        config=AutoKConfig(cost_window=5, probe_interval=0, min_cost_observations=1))
    for ms in (16.0, 15.0, 17.0, 24.0, 28.0):            # ratios 1, 0.9375, 1.0625, then a streak 1.5, 1.75
        p.observe_step(2, 1, ms)
    assert p.costs.factor == 1.0625 and p.costs.cost(2, 1) == 17.0   # an EMA of weight 0.1 would read 1.1
    # the one k measured: the level moves, its shape stays the calibration's
    assert p.summary()["bucket_cost_correction"] == [{"k": 2, "batch_bucket": "1", "ratio": 1.0, "steps": 5}]
    p.observe_step(2, 1, 32.0)                           # the streak's third step; the first step leaves
    assert p.costs.factor == 1.5 and p.costs.cost(2, 1) == 24.0      # 3 of 5 dear: the level has changed
    for _ in range(3):
        p.observe_step(2, 1, 16.0)                       # back at the calibration
    assert p.costs.factor == 1.0 and p.costs.cost(2, 1) == 16.0


def test_a_cost_correction_fades_toward_the_factor_while_its_k_is_not_measured():
    """A k measured dear against the ks around it is no longer chosen, so no step revises its
    shape: it fades toward the calibration's by cost_decay per step since it was last measured,
    and the k is tried again once it could pay."""
    p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [16.0, 16.0]}),
                        config=AutoKConfig(cost_window=3, cost_decay=0.5, probe_interval=0,
                                           min_cost_observations=1))
    for _ in range(3):
        p.observe_step(1, 1, 12.0)                       # k = 1 as calibrated
    for _ in range(3):
        p.observe_step(2, 1, 32.0)                       # then k = 2 at twice its calibration
    for _ in range(3):
        p.observe_step(1, 1, 12.0)                       # then k = 1 as calibrated: factor 1
    assert p.costs.factor == 1.0 and p.costs.cost_curve(1) == [10.0, 12.0, 32.0]   # measured just now
    p._steps += 1                                        # a step later, k = 1 still in use
    assert p.costs.cost_curve(1) == [10.0, 12.0, 24.0]         # 1 + (2 - 1) 0.5
    p._steps += 1
    assert p.costs.cost_curve(1) == [10.0, 12.0, 20.0]         # 1 + (2 - 1) 0.25; k = 1 measured at 1 stays


def test_a_stretch_of_load_moves_the_level_and_a_k_measured_in_it_is_dear_only_while_it_lasts():
    """Load from another process slows every k alike for seconds: a k's steps while it runs alone
    move the level (`factor`), and a k last measured in the stretch follows the level when it ends
    (one ratio per k kept it dear: eager concurrency 1 put 54 of 128 requests at depth 4). A k
    dear against the ks measured around it in time stays dear (`_learn_cost`)."""
    def policy_():
        p = AutoDraftLength(2, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [16.0, 16.0]}),
                            config=AutoKConfig(cost_window=3, cost_decay=1.0, probe_interval=0,
                                               min_cost_observations=1, patience=1))
        p.acceptance = [0.9, 0.9]                          # 2.71 / 16 beats 1.9 / 12 by 7%
        return p

    p = policy_()
    for k, ms in [(1, 12.0)] * 3 + [(2, 16.0)] * 3 + [(2, 24.0)] * 3 + [(1, 18.0)] * 3 + [(1, 12.0)] * 3:
        p.observe_step(k, 1, ms)                         # quiet; k = 2 then the stretch; k = 1; quiet again
    assert p.costs.factor == 1.0 and p.costs.cost_curve(1) == [10.0, 12.0, 16.0]
    assert p.summary()["cost_correction"] == {"1": 1.0, "2": 1.5}      # the raw ratios: k = 2 last at 1.5x
    assert p.choose(1) == 2                              # one ratio per k: 16 x 1.5 = 24 ms, and k = 1
    p = policy_()
    for k, ms in [(1, 12.0)] * 3 + [(2, 24.0)] * 3 + [(1, 12.0)] * 3:
        p.observe_step(k, 1, ms)                         # k = 2 at 1.5x between steps of k = 1 at 1x
    assert p.costs.factor == 1.0 and p.costs.cost_curve(1) == [10.0, 12.0, 24.0] and p.choose(1) == 1


def test_cost_model_log_compares_predicted_and_measured_speedups_per_batch_bucket():
    """auto_k.cost_model (mtpx/auto_k/cost_model_log.py): per power-of-two batch bucket, the speed-up over
    k = 0 the policy predicted for its steps against the one their measured ms and committed
    tokens give, over the bucket's own k = 0 steps when it had some, else the calibration's."""
    p = AutoDraftLength(2, costs({0: [10.0, 20.0], 1: [12.0, 24.0], 2: [14.0, 28.0]}),
                        config=AutoKConfig(cost_window=2, probe_interval=0, prior_acceptance=0.5,
                                           min_cost_observations=100))
    assert p.expected_tokens(2) == 1.75                 # no round observed: the prior 0.5 stays
    for k, b, ms, tokens in [(2, 4, 21.0, 7),   # predicted 28 ms (factor 1), plain 20; factor -> 0.75
                             (2, 5, 26.25, 9),  # 28 * 5 / 4 * 0.75 = 26.25, plain 18.75 (calibrated 25)
                             # predicted 15 ms; a plain step: 16 / 20 = 0.8; factor -> 0.775 (window 2)
                             (0, 4, 16.0, 4),
                             (2, 1, 10.5, 3)]:  # predicted 0.775 * 14 = 10.85, plain 7.75 (calibrated 10)
        p.observe_step(k, b, ms, tokens)
        p.record(k, b)
    p.record(2, 1)                                       # a decode step not compared (a prefill in it)
    p.record(1, 16)
    assert p.summary()["cost_model"] == {
        "1": {"decode_steps": 2, "steps": 1, "predicted_tokens_per_request": 1.75,
              "measured_tokens_per_request": 3.0, "predicted_step_ms": 10.85, "measured_step_ms": 10.5,
              "predicted_speedup": 1.25,                 # 1.75 * 7.75 / 10.85
              "measured_speedup": 2.8571,                # (3 / 10.5) / (1 / 10): no plain step in the bucket
              "plain_step_ms_source": "calibrated", "plain_steps": 0},
        "4-7": {"decode_steps": 3, "steps": 3,
                "predicted_tokens_per_request": 1.5192,    # (4 * 1.75 + 5 * 1.75 + 4 * 1) / 13 = 19.75 / 13
                "measured_tokens_per_request": 1.5385,     # (7 + 9 + 4) / 13
                "predicted_step_ms": 23.0833,              # (28 + 26.25 + 15) / 3
                "measured_step_ms": 21.0833,               # (21 + 26.25 + 16) / 3
                "predicted_speedup": 1.1792,               # (19.75 / 69.25) / (13 / (20 + 18.75 + 15))
                "measured_speedup": 1.2648,                # (20 / 63.25) / (13 / (0.8 * (20 + 25 + 20)))
                "plain_step_ms_source": "measured", "plain_steps": 1},
        "16-31": {"decode_steps": 1, "steps": 0, "predicted_tokens_per_request": None,
                  "measured_tokens_per_request": None, "predicted_step_ms": None, "measured_step_ms": None,
                  "predicted_speedup": None, "measured_speedup": None, "plain_step_ms_source": None,
                  "plain_steps": 0}}
    assert p.costs.factor == pytest.approx(0.775)              # the median of the last 2: 0.8 and 10.5 / 14
    p.reset_histograms()                                 # a measured pass starts: the log restarts,
    assert p.summary()["cost_model"] == {} and p.costs.factor == pytest.approx(0.775)   # the correction stays


def test_measured_costs_of_a_k_move_the_choice_after_min_cost_observations():
    """Calibrated costs say k = 1 is best at batch 4; steps at k = 3 measured at half their
    calibrated cost make k = 3 the choice once min_cost_observations of them were seen (before,
    the ks measured enough in the bucket, k = 1 alone, scale every k alike)."""
    p = AutoDraftLength(3, costs({0: [8.0, 16.0], 1: [10.0, 20.0], 2: [14.0, 28.0], 3: [16.0, 32.0]}),
                        config=AutoKConfig(min_verified=0, explore_costs=False, probe_interval=0, patience=1,
                                           prior_acceptance=0.5, min_cost_observations=8, cost_decay=1.0))
    p.settled_interval = 1              # decides every step
    p.acceptance = [0.8, 0.5, 0.5]                       # E[tokens | k] = 1, 1.8, 2.2, 2.4
    assert step(p, 4) == 1                               # 1.8 / 20 beats 2.2 / 28 and 2.4 / 32
    for _ in range(8):
        p.observe_step(1, 4, 20.0)                       # k = 1 as calibrated
    for _ in range(7):
        p.observe_step(3, 4, 16.0)                       # k = 3 at half its calibrated 32 ms
    assert p.costs.cost_curve(4) == [16.0, 20.0, 28.0, 32.0]   # 7 steps: k = 1's ratio 1 for every k
    assert step(p, 4) == 1
    p.observe_step(3, 4, 16.0)
    # ratios 1, 1, 0.75 (between k = 1 and k = 3), 0.5: 16, 20, 21, 16, then non-decreasing: 20, 21
    # and 16 pool to 19
    assert p.costs.cost_curve(4) == [16.0, 19.0, 19.0, 19.0]
    assert step(p, 4) == 3                               # 2.4 / 19 beats 1.8 / 19 by far
    assert p.summary()["bucket_cost_correction"] == [
        {"k": 1, "batch_bucket": "4-7", "ratio": 1.0, "steps": 8},
        {"k": 3, "batch_bucket": "4-7", "ratio": 0.5, "steps": 8}]
    # bucket 1: the one factor
    assert p.costs.cost_curve(1) == [p.costs.factor * c for c in (8.0, 10.0, 14.0, 16.0)]


def test_observe_counts_only_the_drafts_that_were_verified():
    p = AutoDraftLength(4, config=AutoKConfig(prior_weight=1.0, decay=0.5, prior_acceptance=1.0))
    p.observe_round(num_draft_tokens=4, num_accepted=1)        # 1 accepted, 2 rejected, 3-4 never reached
    # each position's prior is the estimate before it: (0 + 1 * 1.0) / (1 + 1), then 0.5 unverified
    assert p.acceptance == [1.0, 0.5, 0.5, 0.5] and p.num_observed == [1, 1, 0, 0]
    p.observe_round(num_draft_tokens=2, num_accepted=2)        # both accepted, nothing beyond verified
    assert p.acceptance == [1.0, 2 / 3, 2 / 3, 2 / 3] and p.num_observed == [2, 2, 0, 0]
    p.record(2)                                          # a new step: counts halve (2 of 2 -> 1 of 1)
    p.observe_round(num_draft_tokens=2, num_accepted=1)        # position 2: (0.5 + 0 + 1 * 1.0) / (1 + 1 + 1)
    assert p.acceptance[1] == pytest.approx(1.5 / 3)
    p.observe_round(num_draft_tokens=0, num_accepted=0)
    assert p.num_observed == [3, 3, 0, 0]


def test_an_unverified_position_takes_the_estimate_of_the_one_before_it():
    p = AutoDraftLength(8, {(k, 1): 10.0 + k for k in range(9)})
    for _ in range(40):                                  # rounds of 4 drafts, all accepted
        p.observe_round(num_draft_tokens=4, num_accepted=4)
    assert p.acceptance[3] == pytest.approx(1 - 8 * (1 - p.acceptance[2]) / 48)   # (40 + 8 p_3) / 48
    assert p.acceptance[4:] == [p.acceptance[3]] * 4     # never verified: position 4's estimate
    assert p.depth(1) == 8                               # so a new request keeps all 8 modules
    fresh = AutoDraftLength(8, {(k, 1): 10.0 + k for k in range(9)})
    assert fresh.acceptance == [0.7] * 8


def test_an_estimate_no_step_verifies_drifts_back_to_the_prior_and_depth_rises_again():
    p = AutoDraftLength(1, {(0, 1): 10.0, (1, 1): 15.0},
                        config=AutoKConfig(prior_weight=1.0, decay=0.5, prior_acceptance=1.0,
                                           explore_costs=False))   # k = 1 pays iff p_1 > 0.5
    for _ in range(4):
        p.observe_round(num_draft_tokens=1, num_accepted=0)    # 4 rejections: (0 + 1) / (4 + 1)
    assert p.acceptance == [pytest.approx(1 / 5)] and p.depth(1) == 0
    p.record(0)                                          # a step verifies nothing: counts halve
    assert p.acceptance == [pytest.approx(1 / 3)] and p.depth(1) == 0
    for _ in range(3):
        p.record(0)                                      # (0 + 1) / (0.25 + 1)
    assert p.acceptance == [pytest.approx(0.8)] and p.depth(1) == 1   # a new request drafts again


def test_the_estimates_start_at_the_prior_acceptance_and_it_sets_the_first_requests_depth():
    # the demo's calibration at batch 1 and 64 (experiments/auto_k/calibration/calibrate_out.txt, run 0)
    ms = {1: [14.2, 18.7, 20.3, 24.1, 23.7, 26.0, 25.7, 26.0, 25.4],
          64: [42.9, 92.1, 114.3, 129.9, 142.2, 157.2, 175.0, 190.4, 213.7]}
    step_costs = {(k, b): row[k] for b, row in ms.items() for k in range(9)}
    p = AutoDraftLength(8, step_costs, config=AutoKConfig(explore_costs=False))
    assert p.acceptance == [0.7] * 8
    p.observe_round(num_draft_tokens=2, num_accepted=2)         # (1 + 8 * 0.7) / (1 + 8), then its own prior
    p1 = 6.6 / 9
    assert p.acceptance[:3] == [pytest.approx(p1), pytest.approx((1 + 8 * p1) / 9),
                                pytest.approx((1 + 8 * p1) / 9)]
    p.reset()
    # no acceptance seen yet: at batch 64 drafting pays only from a flat p of about 0.8, so at the
    # prior no k beats k = 0; at the prior's upper estimate (0.7 + sqrt(0.21 / 9) = 0.853: one
    # standard deviation of Beta(5.6, 2.4)) k = 3 would (the smallest such, which exploring holds),
    # and k = 5 would most, k = 4 within the hysteresis of it (1.4% less), so the first requests
    # are admitted at depth 4 (`_landing`: the cheaper k wins a tie; the whole batch tests
    # positions 1-4); without optimism they prefill no module; at batch 1 they keep all 8
    assert p.goodput(0, 64) > max(p.goodput(k, 64) for k in range(1, 9))
    assert p.exploring.depth(p.estimates, 0, 64) == 3 and p.depth(64) == 4 and p.depth(1) == 8
    assert AutoDraftLength(8, step_costs,
                           config=AutoKConfig(explore_costs=False, optimistic_falls=False)).depth(64) == 3
    assert AutoDraftLength(8, step_costs,
                           config=AutoKConfig(explore_costs=False, optimism=0.0)).depth(64) == 0
    optimistic = AutoDraftLength(8, step_costs, config=AutoKConfig(prior_acceptance=1.0))
    assert optimistic.depth(64) == 8


def test_an_unlearned_position_beyond_the_k_in_use_is_explored():
    """At a batch where the prior says k = 0, nothing would ever draft and the prior would never be
    tested (experiments/concurrency/final: auto at depth 0 for every request at concurrency 64,
    where k = 1 gained 1.09x): while position k + 1 has fewer verified drafts than prior_weight,
    new requests get depth k + 1, running ones do not fall below it, and every `patience` steps a
    step proposes k + 1 drafts, where k + 1 would pay at the position's upper estimate; once the
    drafts are verified the usual rules apply."""
    ms = {(0, 64): 100.0, (1, 64): 180.0}              # k = 1 pays from p > 1.05 x 1.8 - 1 = 0.89
    # optimism = 2 standard deviations: position 1's upper estimate is 0.7 + 2 sqrt(0.21 / 9) > 1, so 1
    p = AutoDraftLength(1, ms, config=AutoKConfig(probe_interval=0, patience=2, explore_costs=False,
                                                  optimism=2.0, explore_budget=1.0))
    p.settled_interval = 1              # decides every step
    assert p.unlearned(0) and not p.unlearned(1)        # position 1 unseen; no position 2
    assert p.exploring.explores(p.estimates, 0, 64)                       # at p = 1, 2 / 180 beats 1.05 / 100
    wary = AutoDraftLength(1, {(0, 64): 100.0, (1, 64): 200.0}, config=AutoKConfig(optimism=2.0))
    assert not wary.exploring.explores(wary.estimates, 0, 64)   # 2 / 200 does not
    one = AutoDraftLength(1, ms)
    assert not one.exploring.explores(one.estimates, 0, 64)   # one deviation: 1.853 / 180 does not either
    assert p.depth(64) == 1                             # admitted one deeper than the best k, 0
    # k = 1 in use at first (max_k), held: at position 1's upper estimate it beats k = 0
    assert [step(p, 64) for _ in range(3)] == [1, 1, 1] and p.k == 1
    p.k = 0                                             # as after a fall
    assert [lower(p, 64, 1) for _ in range(3)] == [1, 1, 1]   # held at 1 while position 1 is unlearned
    assert [step(p, 64) for _ in range(4)] == [1, 0, 1, 0]    # an exploring probe every patience steps
    for _ in range(10):                                  # 10 verified drafts, all rejected: learned
        p.observe_round(num_draft_tokens=1, num_accepted=0)
    assert not p.unlearned(0) and p.depth(64) == 0
    assert [step(p, 64) for _ in range(4)] == [0, 0, 0, 0]
    step(p, 64)
    assert [lower(p, 64, 1), (step(p, 64), lower(p, 64, 1))[1]] == [1, 0]   # falls after patience
    p.record(0)
    assert p.unlearned(0) is False                       # 10 x 0.99^k stays above 8 for 22 steps


def test_exploring_pauses_once_it_has_spent_its_budget():
    """Compiled concurrency 16 (experiments/concurrency/held_depth, compiled_c16_run2): a position
    that only the exploring probes verify never reaches min_verified under the discount, so
    exploring held about 50 requests at depth 8 for the whole run, every step paying their catch-up
    (0.74x plain). Exploring's predicted spend (its probes, and every step's cost over the same
    step with no request held deeper than the k in use) is kept within explore_budget of the
    steps' predicted cost, discounted alike. A k = 0 step runs no module (lazy catch-up) and costs
    plain decoding's 100 ms (its deferred catch-up unpriced here): only the probes spend."""
    ms = {(0, 16): 100.0, (1, 16): 180.0}
    p = AutoDraftLength(1, ms, config=AutoKConfig(probe_interval=0, patience=2, explore_costs=False,
                                                  optimism=2.0, explore_budget=0.01))
    p.settled_interval = 1              # decides every step
    p.k = 0
    assert p.exploring.explores(p.estimates, 0, 16) and p.depth(16) == 1 and p.exploring.spent() == 0.0
    depths = [0] * 15 + [1]          # one request admitted at the explored depth: k = 1 does not pay
    ks = []                          # (15 + 1.7) / 16 / 180 < 1.05 / 100
    for _ in range(5):
        choice = p.decide(16, 1, held=1, depths=depths)
        # an exploring probe costs k = 1's step, 80 ms over the k in use's; a k = 0 step 100 ms
        assert (choice.step_ms, choice.explore_ms) == ((180.0, 80.0) if choice.k else (100.0, 0.0))
        p.commit(choice)
        p.record(choice.k, 16)
        ks.append(choice.k)
    assert ks == [1, 0, 1, 0, 1]     # a probe every patience = 2 steps
    # the steps' sum starts as 100 steps (1 / (1 - decay)) of the first one, 18000 ms; the three
    # probes' 80 ms discounted alike
    assert p.exploring.spent() == pytest.approx((0.99 ** 4 * 80 + 0.99 ** 2 * 80 + 80) / 18000,
                                                rel=0.02)    # 0.0132 > 0.01
    assert p.depth(16) == 0                                            # admitted at the k in use
    assert [p.choose(16, 1) for _ in range(2)] == [0, 0]               # no probe
    plain = p.decide(16, 0, depths=[0] * 16)                           # the depth-1 request is gone
    assert (plain.k, plain.step_ms, plain.explore_ms) == (0, 100.0, 0.0)
    n = 0
    while p.exploring.spent() >= 0.01:                                   # the spend decays away
        p.commit(p.decide(16, 0, depths=[0] * 16))
        n += 1
    # the probes' discounted spend over the steps' discounted sum falls below 0.01 from n = 45
    assert n == 45 and p.depth(16) == 1                                # then exploring resumes
    never = AutoDraftLength(1, ms, config=AutoKConfig(explore_costs=False, optimism=2.0, explore_budget=0.0))
    never.settled_interval = 1              # decides every step
    never.k = 0
    assert never.depth(16) == 0


def test_an_explored_admission_weighs_its_prefill_and_spends_it_from_the_budget():
    """Compiled concurrency 16 (experiments/concurrency/rise_margin): requests admitted at an
    explored depth paid their modules' prefill, which exploring neither weighed nor counted
    (its spend 0.0032 of the steps' cost against a budget of 0.001). Now the explored depth must
    pay with its prefill, and the prefill beyond the depth it would have had is spent from the
    budget when the request is admitted, before any step (the budget's window then starts from
    the admission's predicted step: 100 steps of 100 ms)."""
    ms = {(0, 16): 100.0, (1, 16): 180.0}
    p = AutoDraftLength(1, ms, config=AutoKConfig(probe_interval=0, patience=2, explore_costs=False,
                                                  optimism=2.0, explore_budget=0.01))
    p.k = 0
    p.costs.set_prefill_cost(0.2)                                 # 200 ms for 1000 prompt tokens at depth 1
    assert p.depth(16) == 1                                 # no prompt: explored, as before
    short = p.decide_depth(16, prompt_tokens=1000, max_tokens=100)    # 2 ms more per output token
    assert (short.depth, short.explore_ms) == (0, 0.0)
    long = p.decide_depth(16, prompt_tokens=1000, max_tokens=10 ** 6)
    assert (long.depth, long.explore_ms, long.step_ms) == (1, pytest.approx(200.0), 100.0)
    assert p.exploring.spent() == 0.0                         # a query
    p.commit_depth(long)                                    # the scheduler, once it is admitted
    assert p.exploring.spent() == pytest.approx(200.0 / (100.0 / 0.01))   # 0.02 > 0.01
    assert p.decide_depth(16, prompt_tokens=1000, max_tokens=10 ** 6).depth == 0
    p.commit(p.decide(16, 1, held=1, depths=[1]))           # the steps' window keeps its start
    # a k = 0 step: plain decoding's 100 ms plus the held module's deferred catch-up (0.2 ms, priced
    # at the module prefill's per position and module until a catch-up is measured)
    assert p.exploring.budget.step_ms == pytest.approx(0.99 * 10000 + 100.2)


def test_the_first_admissions_weigh_the_prefill_measured_at_start_up():
    """The compiled demo's calibration at concurrency 16 (depth buckets [0, 4, 8]: k = 1-4 cost
    k = 4's step, 40.66 ms against k = 0's 11.58). With the start-up measurement of the modules'
    prefill (0.02 ms per prompt token and module, 150-token prompts, 128 output tokens: 0.094 ms
    more per token at depth 4) depth 4 cannot pay for the request itself, at the upper estimates
    either (admission_landing="request", the default). Weighing the batch instead
    (admission_landing="batch"), the first wave tests k = 4, which the prior's upper estimates
    (3.7 tokens a round) make pay for the batch, whatever its prompts' length
    (experiments/concurrency/draft_costs)."""
    ms = {(k, 16): 11.58 if k == 0 else 40.66 if k <= 4 else 66.23 for k in range(9)}
    p, q = AutoDraftLength(8, ms), AutoDraftLength(8, ms, config=AutoKConfig(admission_landing="batch"))
    assert p.depth(16, prompt_tokens=150, max_tokens=128) == 4
    p.costs.set_prefill_cost(0.02)
    q.costs.set_prefill_cost(0.02)
    assert p.depth(16, prompt_tokens=150, max_tokens=128) == 0
    assert [q.depth(16, prompt_tokens=n, max_tokens=128) for n in (40, 150, 400)] == [4, 4, 4]
    with pytest.raises(ValueError, match="admission_landing='wave'"):
        AutoDraftLength(8, ms, config=AutoKConfig(admission_landing="wave"))
    assert p.costs.prefill_ms(4, 150) == pytest.approx(12.0)
    p.costs.observe_prefill(1000, 30.0)                           # the running engine's prefills join it
    assert p.costs.prefill_module_ms.value == pytest.approx(0.025)


def test_a_request_held_deeper_prices_its_draft_round_at_the_calibrated_one():
    """The compiled demo at concurrency 16 (k = 1-4 cost k = 4's 41.0 ms, k = 0 12.1; the
    calibration's 4-module draft round 5.75 ms): 2 of 16 requests admitted at depth 4 (exploring),
    14 at depth 0, the k in use 4 (it starts at max_k). Priced at t(4) - t(0) = 28.9 ms, the draft
    round made a step below the held depth cost as much as verifying 4 drafts (39 of 246 steps
    verified drafts for 2 requests, 0.87x plain in that chunk; experiments/concurrency/draft_costs).
    Now a k = 0 step runs no module and costs t(0) plus the catch-up it defers (2 requests x 4
    modules x the catch-up's ms per position and module: 0.05 here, 0.4 ms), a k of 1-3 t(k) plus
    the calibrated round's difference (0 here: every depth's round is 5.75 ms); it falls to 0 after
    `patience` steps."""
    ms = {(k, 16): 12.1 if k == 0 else 41.0 if k <= 4 else 66.7 for k in range(9)}
    draft = {(k, 16): 0.0 if k == 0 else 5.75 if k <= 4 else 14.9 for k in range(9)}
    depths = [0] * 14 + [4, 4]

    def run(p):
        ks = []
        for _ in range(3 * p.patience):
            choice = p.decide(16, 4, held=4, depths=depths)
            p.commit(choice)
            ks.append(choice.k)
        return ks
    kw = dict(probe_interval=0, patient_start=True)      # the k in use 4 as in a running engine
    old, new = AutoDraftLength(8, ms, AutoKConfig(**kw)), AutoDraftLength(8, ms, AutoKConfig(**kw))
    new.costs.set_draft_costs(draft)
    new.costs.set_prefill_cost(0.05)
    assert old.costs.held_cost_curve(16, 4)[:2] == pytest.approx([12.1, 41.0])
    assert new.costs.held_cost_curve(16, 4, held_modules=8)[:2] == pytest.approx([12.5, 41.0])
    ks = run(new)
    assert ks[:new.patience - 1] == [4] * (new.patience - 1) and set(ks[new.patience:]) == {0}
    with pytest.raises(ValueError, match="draft costs miss"):
        new.costs.set_draft_costs({(0, 16): 0.0})


def test_a_fall_lands_between_only_where_the_upper_estimates_beat_best_by_the_hysteresis():
    """The compiled demo's calibration at concurrency 16 (experiments/concurrency/admission_prefill:
    k = 1-4 cost k = 4's 39.15 ms, k = 0 11.21) and its start-up prefill (0.0157 ms per prompt
    token and module). A first wave of 100-token prompts: k = 0 is best (1.427 tokens per ms);
    k = 4 at the prior's upper estimates (3.73 tokens a round), its prefill added, reads 1.444,
    1.1% more, and the whole wave was admitted at depth 4 to test it (0.82x plain in that chunk).
    A k between is tested only where it would be chosen over best, by the hysteresis; with no
    prefill to pay k = 4 reads 1.524 (6.8% more) and still is (admission_landing="request", the
    default)."""
    ms = {(k, 16): 11.21 if k == 0 else 39.15 if k <= 4 else 63.71 for k in range(9)}
    p = AutoDraftLength(8, ms)
    p.costs.set_prefill_cost(0.0157)
    assert p.depth(16, prompt_tokens=100, max_tokens=128) == 0
    assert p.depth(16, prompt_tokens=100, max_tokens=10 ** 9) == 4


def test_a_fall_lands_where_the_upper_estimates_pay_most():
    """A compiled engine with depth buckets [0, 4, 8]: k = 1-4 cost k = 4's step, k = 5-8 k = 8's
    (compiled_c16_buckets_budget_only in experiments/concurrency/explore_budget: the first
    requests were admitted at depth 0, the prior's best, and k = 4, where mtp4 gained 1.10x, was
    never tested). At the prior's upper estimate 0.853 k = 8 cannot pay (5.18 / 600 < 1 / 100 /
    1.05), so k = 8 falls, but k = 4 could (3.73 / 300 > 1.05 / 100): the fall lands there, and
    so do the requests admitted meanwhile, until positions 1-4 are learned."""
    costs = {(k, 16): 100.0 if k == 0 else 300.0 if k <= 4 else 600.0 for k in range(9)}

    def steps(p, n):
        out = []
        for _ in range(n):
            choice = p.decide(16, 8)
            p.commit(choice)
            out.append(choice.k)
        return out
    kw = dict(probe_interval=0, patience=2, explore_costs=False, explore_budget=0.0)
    p, q = (AutoDraftLength(8, costs, AutoKConfig(**kw)),
            AutoDraftLength(8, costs, AutoKConfig(optimistic_falls=False, **kw)))
    p.settled_interval = 1              # decides every step
    assert p.depth(16) == 4 and q.depth(16) == 0
    assert steps(p, 3) == [4, 4, 4] and steps(q, 3) == [0, 0, 0]     # the first step falls at once
    waits = AutoDraftLength(8, costs, AutoKConfig(patient_start=True, **kw))
    waits.settled_interval = 1              # decides every step
    assert steps(waits, 3) == [8, 4, 4]                              # after patience = 2 steps
    for _ in range(30):                                               # position 1 rejected: learned
        p.observe_round(4, 0)
    assert p.acceptance[0] == pytest.approx(5.6 / 38)
    assert steps(p, 2) == [4, 0] and p.depth(16) == 0


def test_a_landing_on_a_marginal_upper_lead_is_exploring_s_to_pay():
    """Compiled concurrency 16 on this CPU (k = 0 13.06 ms, k = 1-4 43.7, 5-8 69.7; module prefill
    0.022 ms a prompt token): at the prior's means k = 0 is best, and k = 4's upper estimates lead
    it by 7% for a 60-token prompt. A first wave landing there whole cost 13% of a chunk
    (experiments/concurrency/first_wave): the landing is exploring's, so admissions land while
    the budget lasts (two: 5.3 ms of prefill each against 0.1% of a window of 100 steps at the k
    in use's 69.7 ms) and the rest at k = 0.
    free_landing_lead 0 lands every one (the rule before); a lead above it lands free (see
    test_a_fall_lands_where_the_upper_estimates_pay_most: 24% with the budget at 0), and so does a
    request admitted alone (batch 1: concurrency 1 lands on k = 8 this way)."""
    costs = {(k, 16): 13.06 if k == 0 else 43.7 if k <= 4 else 69.7 for k in range(9)}

    def admit(p, n):
        depths = []
        for _ in range(n):
            choice = p.decide_depth(16, depths=depths, prompt_tokens=60, max_tokens=128)
            p.commit_depth(choice)
            depths.append(choice.depth)
        return depths
    for lead, expected in ((0.1, [4, 4] + [0] * 14), (0.0, [4] * 16)):
        p = AutoDraftLength(8, costs, config=AutoKConfig(free_landing_lead=lead))
        p.costs.set_prefill_cost(0.022)
        g = with_prefill(p._goodputs(16, 8, None), [p.costs.prefill_ms(k, 60) / 128 for k in range(9)])
        assert p._upper_goodputs(g, 0, 8, None)[4] / g[0] == pytest.approx(1.07, abs=0.005)
        assert admit(p, 16) == expected
    assert p.exploring.spent() == 0.0                  # a free landing spends nothing
    alone = AutoDraftLength(8, costs)                 # alone, a request pays for its own test
    alone.costs.set_prefill_cost(0.022)
    for _ in range(4):
        choice = alone.decide_depth(1, depths=[], prompt_tokens=60, max_tokens=128)
        alone.commit_depth(choice)
        assert choice.depth == 4 and not choice.explore_ms
    p = AutoDraftLength(8, costs)
    p.costs.set_prefill_cost(0.022)
    choice = p.decide_depth(16, depths=[], prompt_tokens=60, max_tokens=128)
    assert choice.depth == 4 and choice.explore_ms == pytest.approx(4 * 60 * 0.022)


def test_calibrated_costs_are_made_non_decreasing_in_k():
    p = AutoDraftLength(2, costs({0: [10.0], 1: [14.0], 2: [12.0]}, batches=(1,)))
    assert [p.step_costs[(k, 1)] for k in range(3)] == [10.0, 13.0, 13.0]


def test_calibrated_costs_of_k_from_1_are_a_running_median():
    exact = {0: 10.0, **{k: 20.0 + 3.0 * k + 0.5 * k * k for k in range(1, 9)}}
    p = AutoDraftLength(8, {(k, 1): ms for k, ms in exact.items()})
    assert [p.step_costs[(k, 1)] for k in range(9)] == [exact[k] for k in range(9)]   # a smooth curve stays
    noisy = {**exact, 5: exact[5] - 12.0}                  # one cheap-looking k: 35.5 between 40 and 56
    q = AutoDraftLength(8, {(k, 1): ms for k, ms in noisy.items()})
    # k = 4 and 5 take the medians of their neighbourhoods, med(33.5, 40, 35.5) and med(40, 35.5, 56)
    assert [q.step_costs[(k, 1)] for k in range(9)] == [10.0, 23.5, 28.0, 33.5, 35.5, 40.0, 56.0, 65.5, 76.0]
    # k >= 1 measured below k = 0 is held at k = 0's cost: nothing costs less than a plain step
    wild = {0: 2.0, **{k: 0.1 for k in range(1, 7)}, 7: 30.0, 8: 60.0}
    r = AutoDraftLength(8, {(k, 1): ms for k, ms in wild.items()})
    assert [r.step_costs[(k, 1)] for k in range(9)] == [2.0] * 7 + [30.0, 60.0]


def test_step_costs_must_cover_every_k_and_files_round_trip(tmp_path):
    with pytest.raises(ValueError, match=r"miss \(k, batch size\) \[\(1, 4\)\]"):
        AutoDraftLength(1, {(0, 1): 1.0, (1, 1): 2.0, (0, 4): 3.0})
    c = costs({0: [1.0, 2.0], 1: [1.5, 4.0]})
    save_step_costs(tmp_path / "c.json", c, {"threads": 2})
    assert load_step_costs(tmp_path / "c.json") == (c, {"threads": 2})
    (tmp_path / "bad.json").write_text(json.dumps({"step_costs": [{"k": 0}]}))
    with pytest.raises(ValueError, match="spec.cost_model_file=.*bad.json: not a step-cost file"):
        load_step_costs(tmp_path / "bad.json")
    assert default_batch_sizes(64) == [1, 4, 16, 64] and default_batch_sizes(6) == [1, 4, 6]


# ---- the engine with a k per step -----------------------------------------------------------------
MODEL = None


def model():
    global MODEL
    if MODEL is None:
        MODEL = peaked_model(tiny_config())
    return MODEL


def forced_engine(spec: str, k: int, **kw) -> tuple[LLM, AutoDraftLength]:
    """An engine whose every step uses policy.forced (set by the test between steps)."""
    llm = make_llm(model(), spec, k, **kw)
    policy = AutoDraftLength(k)
    llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
    return llm, policy


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.sampled_from([("mtp8", 4), ("mtp1", 3)]),
       segments=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 12)), min_size=2, max_size=6),
       prompt_lens=st.lists(st.integers(1, 30), min_size=1, max_size=3),
       prefix=st.booleans(), seed=st.integers(0, 3))
def test_any_k_schedule_is_lossless_and_drafts_stay_exact(spec, segments, prompt_lens, prefix, seed):
    """Greedy output identical to plain decoding, every proposal equal to the from-scratch drafts
    of the request's tokens, for k schedules with long stretches of k = 0."""
    name, K = spec
    llm, policy = forced_engine(name, K, enable_prefix_caching=prefix, max_num_seqs=3)
    checked = install_draft_check(llm, model(), name, K)
    schedule = [min(k, K) for k, n in segments for _ in range(n)]
    step = iter(schedule)
    policy.forced = next(step)

    def on_step(engine):
        policy.forced = next(step, K)

    g = random.Random(seed)
    prompts = [[g.randrange(2, 64) for _ in range(n)] for n in prompt_lens]
    prompts.append(prompts[0][: max(1, len(prompts[0]) // 2)] + [3, 4])   # shares a prefix
    run_checked(llm, model(), prompts, [_params(g.randrange(5, 40)) for _ in prompts], on_step=on_step)
    assert all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
    assert_clean(llm)


class ScriptedDepths(AutoDraftLength):
    """policy.forced sets every step's k; each admitted request takes the next depth of `depths`;
    with lower_seed, a running request's depth falls by one at random steps (probability 0.2)."""

    def __init__(self, max_k: int, depths, lower_seed: int | None = None):
        super().__init__(max_k)
        self.depths = iter(depths)
        self.rng = None if lower_seed is None else random.Random(lower_seed)

    def decide_depth(self, batch_size: int, current: int | None = None, ages=None, depths=None,
                     prompt_tokens: int = 0, max_tokens: int | None = None) -> DepthChoice:
        if current is None:
            return DepthChoice(next(self.depths, self.max_k))
        if self.rng is not None and current > 0 and self.rng.random() < 0.2:
            return DepthChoice(current - 1, current)
        return DepthChoice(current, current)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(depths=st.lists(st.integers(0, 4), min_size=8, max_size=8),
       segments=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 10)), min_size=1, max_size=4),
       prefix=st.booleans(), lower=st.booleans(), seed=st.integers(0, 3))
def test_per_request_depth_is_lossless_and_runs_no_module_beyond_it(depths, segments, prefix, lower, seed):
    """Requests of depths 0..K in one batch (two passes over prompts that share prefixes, so
    blocks of one depth meet requests of another), depths falling while they run when `lower`:
    greedy output identical to plain decoding, every proposal equal to the from-scratch drafts and
    at most the request's depth long, and the modules beyond a request's depth never advance for
    it (not at all when its depth never fell)."""
    K = 4
    llm = make_llm(model(), "mtp8", K, enable_prefix_caching=prefix, max_num_seqs=3, block_size=4)
    policy = ScriptedDepths(K, depths, seed if lower else None)
    llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
    llm.engine.scheduler.depth_per_request = True
    checked = install_draft_check(llm, model(), "mtp8", K)
    schedule = iter([min(k, K) for k, n in segments for _ in range(n)])
    policy.forced = next(schedule)
    spec = llm.engine.speculator
    before, first = {}, {}

    def on_step(engine):
        for r in engine.scheduler.running:
            row, d = engine.runner.rows[r.index], r.draft_depth
            assert len(r.draft_token_ids) <= d
            computed = spec.computed[row].clone()
            if r.index in before:                  # the step just run had depth d
                assert (computed[d:] == before[r.index][d:]).all()
            if first.setdefault(r.index, d) == d:     # its depth never fell
                assert (computed[d:] == r.num_cached_tokens).all()
            before[r.index] = computed
        policy.forced = next(schedule, K)

    g = random.Random(seed)
    base = [g.randrange(2, 64) for _ in range(14)]
    prompts = [base[:9] + [g.randrange(2, 64) for _ in range(3)], base, base[:5] + [7, 8], base[:13]]
    for _ in range(2):
        before.clear()
        first.clear()
        run_checked(llm, model(), prompts, [_params(g.randrange(5, 25)) for _ in prompts], on_step=on_step)
    assert all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
    assert sorted(policy.depth_histogram.elements()) == sorted(depths)
    assert_clean(llm)


@pytest.mark.parametrize("middle,stretch", [(0, 1), (0, 7), (3, 1), (3, 4), (2, 1)])
def test_module_kv_after_a_k0_stretch_equals_from_scratch(middle, stretch):
    """After k = K steps, `stretch` steps of k = middle (0: no module runs, the modules catch up
    lazily in the next drafting step, mtpx/engine/lazy_catch_up.py; K - 1, a probe one below: the
    module after the drafting ones runs over the last draft; K - 2) and one step of k = K, every
    draft module's KV at the positions whose inputs are known equals its from-scratch value, so the
    drafts (and their acceptance) after the stretch are those of a run that never stopped drafting."""
    K = 4
    llm, policy = forced_engine("mtp8", K)
    checked = install_draft_check(llm, model(), "mtp8", K)
    schedule = [K] * 3 + [middle] * stretch + [K] * 3
    seen = []

    def on_step(engine):
        i = len(seen)
        seen.append(policy.forced)
        if i == 3 + stretch:                        # the first step after the stretch
            (r,) = engine.scheduler.running
            seq, row = r.all_token_ids, engine.runner.rows[r.index]
            n = len(seq) - 1
            ref = _reference_kv(model(), seq, K)
            for m in range(1, K + 1):
                final = n - m + 1                       # positions j with x_{j+m} known
                for got, want in zip(kv_at(engine.cache, m - 1, row, final), kv_at(ref, m - 1, 0, final)):
                    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
            on_step.compared = True
        policy.forced = schedule[i + 1] if i + 1 < len(schedule) else K

    on_step.compared = False
    policy.forced = schedule[0]
    run_checked(llm, model(), [[5, 9, 13, 2, 40, 41, 7]], [_params(40)], on_step=on_step)
    assert on_step.compared
    after = [c for c in checked if len(c[2]) == K][3:]    # proposals after the stretch
    assert after and all(c[0] for c in checked)


@pytest.mark.slow      # 51 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
@pytest.mark.parametrize("middle,catch_up", [([0, 0, 0], False), ([3, 4, 3, 4, 3], False),
                                             ([3, 4, 3, 4, 2, 0, 2, 4], True)])
def test_compiled_module_kv_stays_exact_in_one_draft_graph(trained_tiny, middle, catch_up):
    """Compiled (Dynamo's eager backend: the static shapes) with k = K, then `middle`, then K:
    k = 0 steps run no module (the lazy catch-up runs eager before the next round); a step drafting
    one more than the one before needs no catch-up (the module after the drafting ones ran over
    the last draft), and one drafting more, after a verification that accepted a drafts, first
    runs a round without drafts in the same graph (StepShapes.catch_up; the lagging module covers
    a + K positions, up to 2K - 1). After every step each draft module's KV at the positions
    it computed from known tokens equals its from-scratch value (after a drafting step: every
    position whose inputs are known), every proposal equals the from-scratch
    drafts, and every round has K + 1 columns. (The trained model accepts drafts: a catch-up
    left out gives wrong proposals here.)"""
    K = 4
    torch._dynamo.reset()
    llm = make_llm(trained_tiny, "mtp8", K, compile=True, compile_backend="eager")
    policy = AutoDraftLength(K)
    llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
    checked = install_draft_check(llm, trained_tiny, "mtp8", K)
    step, rounds = llm.engine.runner.step, []
    draft = step.draft

    def spy(batch):
        rounds.append((batch.num_columns, batch.catch_up))
        return draft(batch)
    step.draft = spy
    schedule = [K] * 2 + middle + [K] * 2
    seen = []

    def on_step(engine):
        seen.append(policy.forced)
        assert_module_kv_exact(engine, trained_tiny, current=seen[-1] > 0)
        policy.forced = schedule[len(seen) % len(schedule)]

    policy.forced = schedule[0]
    prompts = [[5, 8, 11, 14], [20, 22, 24], [3, 4, 5, 6, 7, 8, 9], [40, 42, 44]]
    run_checked(llm, trained_tiny, prompts, [_params(40 - 3 * i) for i in range(4)], on_step=on_step)
    assert len(seen) > len(schedule) and checked and all(c[0] for c in checked)
    assert {c for c, _ in rounds} == {K + 1}
    assert any(c for _, c in rounds) == catch_up


def test_calibration_measures_every_k_and_leaves_the_engine_idle(tmp_path):
    llm = LLM(model=model(), spec="mtp8", num_speculative_tokens="auto", max_num_seqs=4,
              cost_model_file=tmp_path / "costs.json")
    policy = llm.engine.draft_length
    assert isinstance(policy, AutoDraftLength) and policy.max_k == len(model().mtp)
    assert sorted(policy.step_costs) == [(k, b) for k in range(policy.max_k + 1) for b in (1, 4)]
    assert all(ms > 0 for ms in policy.step_costs.values())
    assert llm.calibration["source"].startswith("calibrated, saved to")
    assert_clean(llm)
    assert not policy.histogram and policy.num_observed == [0] * policy.max_k
    assert not policy.depth_histogram and policy._steps == 0      # the prefill's dummy requests are forgotten
    prefill = llm.calibration["prefill_module_ms_per_token"]       # 3 prefills of 128 tokens at depth max_k
    assert (prefill > 0
            and json.loads((tmp_path / "costs.json").read_text())["prefill_module_ms_per_token"] == prefill)
    assert (policy.costs.prefill_module_ms.recent[0] == prefill
            and policy.costs.prefill_ms(2, 10) == pytest.approx(20 * prefill))
    # the same steps' draft rounds: none at k = 0, each below its whole step, deeper never cheaper
    draft = {(r["k"], r["batch_size"]): r["draft_ms"]
             for r in json.loads((tmp_path / "costs.json").read_text())["draft_costs"]}
    assert sorted(draft) == sorted(policy.step_costs) and draft[(0, 1)] == draft[(0, 4)] == 0.0
    assert all(0 < draft[(k, b)] < policy.step_costs[(k, b)] for k in range(1, policy.max_k + 1)
               for b in (1, 4))
    assert policy.costs._draft_costs == draft and policy.costs.draft_cost(2, 4) == draft[(2, 4)]
    policy.reset()                                                 # kept, like the step costs
    assert policy.costs.prefill_module_ms.value == prefill and policy.costs._draft_costs == draft
    again = LLM(model=model(), spec="mtp8", num_speculative_tokens="auto", max_num_seqs=4,
                cost_model_file=tmp_path / "costs.json")           # loads the file, measures nothing
    assert again.calibration["seconds"] == 0.0 and again.engine.draft_length.step_costs == policy.step_costs
    assert again.engine.draft_length.costs._draft_costs == draft
    again.engine.draft_length.forced = 2                           # depth 2: the prefill runs 2 modules
    again.generate([[5, 8, 11, 4]], _params(3))
    learned = again.engine.draft_length.costs.prefill_module_ms         # the scheduler fed it the one prefill
    assert learned.count == 2 and list(learned.recent)[0] == prefill and learned.recent[1] > 0
    data = json.loads((tmp_path / "costs.json").read_text())
    del data["prefill_module_ms_per_token"]                        # a file written before it was kept
    (tmp_path / "costs.json").write_text(json.dumps(data))
    third = LLM(model=model(), spec="mtp8", num_speculative_tokens="auto", max_num_seqs=4,
                cost_model_file=tmp_path / "costs.json")           # measures the prefill alone
    assert (third.calibration["source"].startswith("loaded")
            and third.calibration["prefill_module_ms_per_token"] > 0)
    assert (third.engine.draft_length.costs.prefill_module_ms.count == 1
            and not third.engine.draft_length.depth_histogram)
    assert_clean(third)
    again.engine.draft_length.forced = None
    with pytest.raises(ValueError, match="calibrate the step costs before adding requests"):
        from mtpx.core.request import Request
        again.engine.add_request(Request(0, [1, 2], _params(3)))
        again.engine.calibrate()


def test_start_up_calibration_is_cached_per_checkpoint_and_engine_settings(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path / "cache"))

    def auto(**kw):
        return LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=2, **kw)

    first = auto()
    source = first.calibration["source"]
    assert source.startswith(f"calibrated, saved to {tmp_path / 'cache' / 'step_costs'}")
    path = source.removeprefix("calibrated, saved to ")
    again = auto()                                       # same checkpoint and settings: the cache
    # no step timed (a calibration times 10 s of steps); reading the file can take 10 ms on a loaded core
    assert again.calibration["source"] == f"loaded from {path}" and again.calibration["seconds"] < 1.0
    assert again.engine.draft_length.step_costs == first.engine.draft_length.step_costs
    other = auto(block_size=32)                          # another engine setting: its own file
    assert (other.calibration["source"].startswith("calibrated, saved to")
            and path not in other.calibration["source"])
    weights = tiny_ckpt / "model.safetensors"            # rewritten weights: calibrated again
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert auto().calibration["source"].startswith("calibrated, saved to")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    Path(path).write_text("{not json")                    # a damaged cache file is measured again
    assert auto().calibration["source"] == source
    assert auto().calibration["source"] == f"loaded from {path}"
    assert step_cost_cache_path(first.calibration) == Path(path)       # an edit of the engine's source:
    assert step_cost_cache_path({**first.calibration, "code": "edited"}) != Path(path)   # another file
    # compiled, a k costs its depth bucket's step: other buckets are another engine (eager: None)
    assert first.calibration["compile_depths"] is None
    buckets = {**first.calibration, "compile": True, "compile_depths": [0, 4, 8]}
    assert step_cost_cache_path(buckets) != step_cost_cache_path({**buckets, "compile_depths": None})
    with pytest.raises(ValueError, match=r"compile_depths=\[0, 4, 8\] \(this run: None\)"):
        check_step_cost_meta("costs.json", buckets, {**buckets, "compile_depths": None})
    # an in-memory model has no fingerprint: calibrated every time, nothing cached
    before = sorted((tmp_path / "cache" / "step_costs").iterdir())
    mem = LLM(model=model(), spec="mtp8", num_speculative_tokens="auto", max_num_seqs=1)
    assert mem.calibration["source"] == "calibrated"
    assert sorted((tmp_path / "cache" / "step_costs").iterdir()) == before


def test_a_cost_file_of_another_engine_is_refused_with_the_fix(tiny_ckpt, tmp_path):
    path = tmp_path / "costs.json"
    LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=1, cost_model_file=path)
    with pytest.raises(ValueError, match=r"spec.cost_model_file=.*costs.json: calibrated for another engine: "
                                         r"block_size=16 \(this run: 32\).*delete the file"):
        LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=1, block_size=32,
            cost_model_file=path)
    # costs for batches it never measured
    with pytest.raises(ValueError, match=r"max_num_seqs=1 \(this run: 4\)"):
        LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=4, cost_model_file=path)
    ok = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=1,
             cost_model_file=path)
    assert ok.calibration["source"] == f"loaded from {path}"


def _no_start_up_calibration(tmp_path, batches=(1,)) -> Path:
    path = tmp_path / "costs.json"
    save_step_costs(path, {(k, b): 10.0 + k for k in range(len(model().mtp) + 1) for b in batches}, {})
    return path


def test_calibration_times_every_k_alternated_on_the_real_decode_step_without_prefill(tmp_path):
    llm = make_llm(model(), "mtp8", "auto", max_num_seqs=4, enable_prefix_caching=True,
                   cost_model_file=_no_start_up_calibration(tmp_path))
    engine, runner = llm.engine, llm.engine.runner
    prompts = [[(5 * i + j) % 60 + 2 for j in range(20 + 3 * i)] for i in range(3)]
    params = [_params(12)] * len(prompts)
    first, _ = run_checked(llm, model(), prompts, params)       # published prefix-cache blocks
    calls, decode, prefill = [], runner._decode, runner._prefill

    def spy_decode(decodes, results):
        calls.append((decodes[0].num_new_drafts, len(decodes), {d.request.draft_depth for d in decodes},
                      {d.num_draft_tokens for d in decodes}, {d.request.num_tokens for d in decodes}))
        return decode(decodes, results)

    def no_prefill(*a):
        raise AssertionError("the calibration prefilled a prompt")

    runner._decode, runner._prefill = spy_decode, no_prefill
    measured = calibrate_step_costs(engine.time_decode_steps, engine.num_speculative_tokens,
                                    engine.config.max_num_seqs,
                                    batch_sizes=[1, 4], rounds=2, context_len=20, passes=1, spread_s=0)
    runner._decode, runner._prefill = decode, prefill
    n = len(model().mtp) + 1
    assert sorted(measured) == [(k, b) for k in range(n) for b in (1, 4)]
    assert all(ms > 0 for ms in measured.values())
    # every call: each request at depth k verifying k drafts at 20 known tokens (a k-module engine's step)
    assert all(depths == {k} and nd == {k} and ctx == {20} for k, _, depths, nd, ctx in calls)
    for i, b in enumerate((1, 4)):                    # one untimed round, then 2, per batch size
        rounds = [calls[(3 * i + j) * n: (3 * i + j + 1) * n] for j in range(3)]
        assert all(c[1] == b for r in rounds for c in r)
        ks = list(range(n))
        assert [c[0] for c in rounds[0]] == ks                              # rotated, reversed on odd rounds
        assert [c[0] for c in rounds[1]] == (ks[1:] + ks[:1])[::-1]
        assert [c[0] for c in rounds[2]] == ks[2:] + ks[:2]
    assert len(calls) == 2 * 3 * n
    assert_clean(llm)                                 # no block, slot or request left behind
    again, _ = run_checked(llm, model(), prompts, params)       # the prefix cache still serves exact KV
    assert [o.output_token_ids for o in again] == [o.output_token_ids for o in first]


def test_a_calibration_keeps_the_least_of_its_passes_spread_over_the_batch_sizes():
    """Load from another process only slows a step and can cover a whole pass: each (k, B) costs
    the least of its passes' medians (its draft round too), the passes taken over every batch size
    in turn; a compiled engine's k costs its depth bucket's step."""
    from mtpx.engine.decode_step import depth_bucket
    quiet = {1: [8.0, 16.0, 18.0], 4: [10.0, 20.0, 24.0]}
    noisy = {1: [14.7, 27.5, 36.8], 4: [10.5, 21.0, 25.0]}          # batch 1 in a loaded stretch
    script = [noisy, noisy, quiet, quiet, noisy, noisy]               # pass 1: b 1, 4; pass 2; pass 3
    calls = []

    def time_decode_steps(b, ks, context_len, rounds, seed=0, draft=None):
        calls.append((b, tuple(ks)))
        ms = script[len(calls) - 1][b]
        draft.update({k: [ms[k] / 4, ms[k] / 2, 100.0] for k in ks})    # median ms / 2
        return {k: [ms[k] - 1, ms[k], 100.0] for k in ks}              # median ms

    draft: dict = {}
    costs = calibrate_step_costs(time_decode_steps, 2, 4, batch_sizes=[4, 1], draft_costs=draft, spread_s=0)
    assert calls == [(1, (0, 1, 2)), (4, (0, 1, 2))] * 3
    assert costs == {(k, b): quiet[b][k] for b in (1, 4) for k in range(3)}
    assert draft == {(k, b): quiet[b][k] / 2 for b in (1, 4) for k in range(3)}
    calls.clear()
    buckets = {k: depth_bucket(k, 2, [0, 2]) for k in range(3)}                  # compiled: k = 1 pads to 2
    costs = calibrate_step_costs(time_decode_steps, 2, 4, buckets, batch_sizes=[1, 4], passes=2, spread_s=0)
    assert calls == [(1, (0, 2)), (4, (0, 2))] * 2
    assert (costs[(1, 1)] == costs[(2, 1)] == 18.0 and costs[(1, 4)] == costs[(2, 4)] == 24.0
            and costs[(0, 1)] == 8.0)


def test_short_calibration_passes_go_on_until_they_span_spread_s():
    """A batch-1 pass is short, and one noisy stretch can cover three of them (4.5 s: k = 7 and 8
    at 1.23x k = 6, experiments/concurrency/settled): passes go on until the steps they timed add up
    to spread_s (at most max_passes), so a quiet one later in the calibration sets the costs."""
    quiet, noisy = [8.0, 15.0, 16.0], [8.0, 15.0, 21.0]               # k = 2 dear in the stretch
    calls = []

    def time_decode_steps(b, ks, context_len, rounds, seed=0, draft=None):
        calls.append(b)
        ms = noisy if len(calls) <= 3 else quiet                      # the first three passes noisy
        draft.update({k: [1.0] for k in ks})
        return {k: [ms[k]] * 10 for k in ks}                          # 390 or 440 ms a pass

    def calibrate(**kw):
        return calibrate_step_costs(time_decode_steps, 2, 1, **kw)
    assert calibrate(spread_s=0)[(2, 1)] == 21.0                    # 3 passes
    calls.clear()
    assert calibrate(spread_s=2.0)[(2, 1)] == 16.0 and len(calls) == 5   # 3 x 0.44 + 2 x 0.39 s
    calls.clear()
    assert calibrate(spread_s=100.0, max_passes=7) and len(calls) == 7


def test_the_calibrated_step_runs_the_forwards_of_a_real_step_at_that_k(tmp_path, monkeypatch):
    """Same verification window and block bucket, same draft-loop plan (columns, blocks, drafts,
    modules) as a decode step of requests that were prefilled and verify k drafts at depth k."""
    import mtpx.engine.decode_step as mr
    llm = make_llm(model(), "mtp8", "auto", max_num_seqs=3,
                   cost_model_file=_no_start_up_calibration(tmp_path))
    engine, policy, spec = llm.engine, llm.engine.draft_length, llm.engine.speculator
    seen, verify_forward, plan = [], mr.verify_forward, spec.plan

    def spy_verify(model_, cache, meta):
        seen.append(("verify", tuple(meta.positions.shape), tuple(meta.block_table.shape)))
        return verify_forward(model_, cache, meta)

    def spy_plan(cache, b):
        seen.append(("plan", len(b.rows), b.num_columns, b.num_blocks, b.num_drafts, b.num_modules))
        return plan(cache, b)

    monkeypatch.setattr(mr, "verify_forward", spy_verify)
    monkeypatch.setattr(spec, "plan", spy_plan)
    for k in (0, 3, len(model().mtp)):
        policy.forced = k
        reqs = [Request(-1 - i, [(7 * i + j) % 60 + 2 for j in range(30)], _params(40)) for i in range(3)]
        for r in reqs:
            engine.add_request(r)
        while True:
            seen.clear()
            steady = all(r.num_computed_tokens and len(r.draft_token_ids) == k for r in reqs)
            context = max(r.num_tokens for r in reqs)
            engine.step()
            if steady and all(r.draft_depth == k for r in reqs):
                break
        real = list(seen)
        for r in reqs:
            engine.abort(r)
        engine.pop_aborted()
        policy.forced = None
        seen.clear()
        engine.time_decode_steps(3, [k], context, rounds=1, warmup=0)
        assert seen == real and real, (k, real, seen)
    assert_clean(llm)


def test_auto_is_lossless_end_to_end_and_records_the_k_per_step(tmp_path):
    # step costs from a file (the start-up calibration has its own test above): 10 ms + 4 ms per draft
    costs = {(k, b): (10.0 + 4.0 * k) * (1 + 0.25 * b) for k in range(len(model().mtp) + 1) for b in (1, 4)}
    save_step_costs(tmp_path / "costs.json", costs, {"prefill_module_ms_per_token": 0.0})
    llm = make_llm(model(), "mtp8", "auto", max_num_seqs=4, cost_model_file=tmp_path / "costs.json")
    assert llm.calibration["seconds"] == 0.0
    prompts = [[(7 * i + j) % 60 + 2 for j in range(5 + 3 * i)] for i in range(6)]
    run_checked(llm, model(), prompts, [_params(30)] * len(prompts))
    hist = llm.engine.draft_length.histogram
    assert sum(hist.values()) > 0 and set(hist) <= set(range(len(model().mtp) + 1))


def test_the_engine_logs_each_steady_decode_step_with_its_measured_ms_and_committed_tokens(tmp_path,
                                                                                           monkeypatch):
    """The scheduler feeds the policy every pure decode step at a steady k with the runner's step
    time and the tokens its verification committed. The clock is scripted: 1 s per reading, so a
    decode step that drafts reads 3000 ms (verify 2 readings, draft 1) and one that does not 2000."""
    n = len(model().mtp)
    costs = {(k, b): 3000.0 for k in range(n + 1) for b in (1, 2, 3, 4)}    # flat: k = n pays most
    save_step_costs(tmp_path / "costs.json", costs, {})
    # the padded step's batch-wide k (per-request k logs its allocations: tests/test_ragged.py)
    llm = make_llm(model(), "mtp8", "auto", max_num_seqs=4, cost_model_file=tmp_path / "costs.json",
                   ragged_batch=False)
    policy, scheduler, clock = llm.engine.draft_length, llm.engine.scheduler, iter(range(10 ** 6))
    monkeypatch.setattr(llm.engine.runner, "_now", lambda: float(next(clock)))
    seen, pairs, update = spy(monkeypatch, policy, "observe_step"), [], scheduler.update_from_output

    def update_from_output(out, result):
        observed = len(seen)
        finished = update(out, result)
        if len(seen) > observed:        # (tokens logged, tokens the step's decodes verified)
            pairs.append((seen[-1][3],
                          sum(len(result.results[d.request.index].token_ids) for d in out.decodes)))
        return finished

    monkeypatch.setattr(scheduler, "update_from_output", update_from_output)
    prompts = [[(7 * i + j) % 60 + 2 for j in range(5 + 3 * i)] for i in range(6)]
    run_checked(llm, model(), prompts, [_params(30)] * len(prompts))
    assert seen and all(ms == 3000.0 and 1 <= b <= 4 and b <= tokens <= b * (k + 1)
                        for k, b, ms, tokens in seen)
    assert len(pairs) == len(seen) and all(logged == verified for logged, verified in pairs)
    log = policy.summary()["cost_model"]
    assert sum(r["decode_steps"] for r in log.values()) == sum(policy.histogram.values())
    assert sum(r["steps"] for r in log.values()) == len(seen)
    for row in log.values():       # every cost 3000 ms, predicted and measured: speed-up = tokens per request
        if row["steps"]:
            assert row["measured_step_ms"] == row["predicted_step_ms"] == 3000.0
            assert row["measured_speedup"] == row["measured_tokens_per_request"]
            assert row["predicted_speedup"] == row["predicted_tokens_per_request"]


def test_auto_needs_a_speculator_and_a_known_word():
    with pytest.raises(ValueError, match="needs a speculator"):
        LLM(model=model(), num_speculative_tokens="auto")
    with pytest.raises(ValueError,
                       match=r"^spec.num_speculative_tokens='automatic': "
                             r"give an integer >= 0, null or auto$"):
        LLM(model=model(), spec="mtp8", num_speculative_tokens="automatic")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mine=st.integers(1, 3), others=st.lists(st.integers(0, 4), min_size=0, max_size=2),
       draft=st.sampled_from(["greedy", "probabilistic"]), step_k=st.sampled_from([None, 4, 3]),
       seed=st.integers(0, 3))
def test_seeded_request_same_alone_and_beside_other_depths(mine, others, draft, step_k, seed):
    """A seeded sampled request at depth `mine` emits the same tokens alone and next to requests of
    other depths (deeper ones run more modules in the step), whatever the step's k (forced; None:
    the deepest depth), for greedy and probabilistic drafts: each row draws only the uniforms of
    its own drafts."""
    K = 4

    def run(depths, prompts, params):
        llm = make_llm(model(), "mtp8", K, max_num_seqs=4, draft_sample_method=draft)
        policy = ScriptedDepths(K, depths)
        policy.forced = None if step_k is None else max(step_k, mine)
        llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
        llm.engine.scheduler.depth_per_request = True
        outs = llm.generate(prompts, params)
        assert_clean(llm)
        return outs

    g = random.Random(seed)
    prompt = [g.randrange(2, 64) for _ in range(6)]
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=3 + seed, ignore_eos=True)
    (alone,) = run([mine], [prompt], [params])
    others = [K] + others                       # a deeper request runs modules beyond `mine`
    prompts = [[g.randrange(2, 64) for _ in range(g.randrange(2, 9))] for _ in others]
    mates = [SamplingParams(max_tokens=g.randrange(16, 30), temperature=0.8, seed=g.randrange(99),
                            ignore_eos=True) for _ in others]
    outs = run([mine] + others, [prompt] + prompts, [params] + mates)
    assert outs[0].output_token_ids == alone.output_token_ids
    assert outs[0].spec.num_drafts == alone.spec.num_drafts
