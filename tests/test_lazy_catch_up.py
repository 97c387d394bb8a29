"""Lazy catch-up (mtpx/engine/lazy_catch_up.py): a decode step without drafts runs no draft module;
the modules of a request that fell behind catch up in one round when it drafts again (or before
its ring of target hidden states overflows). Module KV exact against from-scratch (every module,
every computed position, after every step), greedy output identical to plain decoding under
forced k schedules with prefix caching and preemption, and no module forward in a step without
drafts."""
from __future__ import annotations

import pytest
from mtpx.auto_k import AutoDraftLength, AutoKConfig
from mtpx.core.step_plan import Round, StepRecord
from mtpx.engine.lazy_catch_up import LazyCatchUp
from mtpx.metrics.report import format_run_estimate
from mtpx.spec_decode import common
from tests.helpers import _params, assert_clean, install_draft_check, make_llm, run_checked
from tests.test_auto_k import forced_engine, model
from tests.test_reprefill import assert_module_kv_exact


@pytest.mark.parametrize("spec,K,window", [
    ("mtp8", 4, 10),
    pytest.param("mtp8", 4, None),
    pytest.param("mtp1", 3, 8)])
def test_module_kv_is_exact_while_behind_and_after_a_lazy_catch_up(spec, K, window):
    """Forced k = K, 0 x 9, K, 0, 0, K - 1, 0, K, ... over two requests: after every step the KV of
    every module at every position it computed equals from-scratch, after every drafting step
    every module is current, every proposal equals the from-scratch drafts; window: a ring small
    enough that the long stretch overflows it (a catch-up without drafts inside the stretch)."""
    llm, policy = forced_engine(spec, K)
    runner = llm.engine.runner
    if window is not None:
        runner.lazy = LazyCatchUp(llm.engine.speculator, runner.cache, window)
    checked = install_draft_check(llm, model(), spec, K)
    schedule = [K] + [0] * 9 + [K, 0, 0, K - 1, 0, K] * 2
    seen = []

    def on_step(engine):
        seen.append(policy.forced)
        assert_module_kv_exact(engine, model(), current=seen[-1] > 0)
        policy.forced = schedule[len(seen) % len(schedule)]

    policy.forced = schedule[0]
    tokens_before = runner.lazy.num_module_tokens
    run_checked(llm, model(), [[5, 9, 13, 2, 40, 41, 7], [3, 8, 8, 1]], [_params(24), _params(18)],
                on_step=on_step)
    assert checked and all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
    assert runner.lazy.num_module_tokens > tokens_before      # the catch-up ran
    assert_clean(llm)


@pytest.mark.parametrize("spec,K,window", [("mtp8", 4, None), ("mtp8", 4, 16)])
def test_a_prefill_at_k_0_defers_the_modules_to_the_catch_up(spec, K, window):
    """Prompts of 19 and 13 tokens prefilled in chunks of at most 8 tokens while k = 0: no module
    runs in those steps (every prompt position waits in the ring), the first step that drafts
    catches every module up over prompt and decoded positions in one round, and after every step
    the module KV at every computed position equals from-scratch (every module), every proposal
    the from-scratch drafts. window 16: the 19-token prompt does not fit the ring, so its chunk
    runs the modules (and catches up its deferred first chunk) at once."""
    llm, policy = forced_engine(spec, K, max_num_batched_tokens=8, block_size=4)
    runner = llm.engine.runner
    if window is not None:
        runner.lazy = LazyCatchUp(llm.engine.speculator, runner.cache, window)
    checked = install_draft_check(llm, model(), spec, K)
    schedule = [0] * 6 + [K, 0, K - 1, K, 0]
    seen, module_tokens = [], []
    prefill = runner._prefill

    def counted(prefills, results, defer=False, *args):
        s, n = prefill(prefills, results, defer, *args)
        module_tokens.append((defer, n))
        return s, n
    runner._prefill = counted

    def on_step(engine):
        seen.append(policy.forced)
        assert_module_kv_exact(engine, model(), current=seen[-1] > 0)
        policy.forced = schedule[min(len(seen), len(schedule) - 1)]

    policy.forced = schedule[0]
    prompts = [[(7 * i + 3) % 50 + 2 for i in range(19)], [(5 * i + 1) % 40 + 2 for i in range(13)]]
    run_checked(llm, model(), prompts, [_params(16), _params(12)], on_step=on_step)
    assert checked and all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
    deferred = [n for defer, n in module_tokens if defer]
    assert len(deferred) >= 4
    assert (all(n == 0 for n in deferred) if window is None else 0 < sum(deferred) < 19 * K)
    assert runner.lazy.num_module_tokens >= (13 + 19 - (0 if window is None else 16)) * K - 2 * K * K
    assert_clean(llm)


def test_forced_schedules_with_prefix_caching_and_preemption_equal_plain_greedy():
    """k schedule 0, 0, 0, K, 0, 3, 0, 0, 1, K, ... on five requests sharing prefixes, in a pool so
    small that requests are preempted, prefix caching on (check_invariants: no published block is
    written, so no module KV was published before it was computed): greedy tokens identical to plain
    decoding, every proposal equal to from-scratch drafts."""
    K = 4
    llm, policy = forced_engine("mtp8", K, enable_prefix_caching=True, max_num_seqs=4, block_size=4,
                                num_blocks=30)
    checked = install_draft_check(llm, model(), "mtp8", K)
    schedule = [0, 0, 0, K, 0, 3, 0, 0, 1, K, K, 0, 2]
    steps = []

    def on_step(engine):
        steps.append(engine.scheduler.num_preemptions)
        policy.forced = schedule[len(steps) % len(schedule)]

    policy.forced = schedule[0]
    base = [7, 3, 9, 12, 5, 5, 30, 2, 11, 4, 6]
    prompts = [base, base[:8] + [1, 2], base + [8, 8, 9], base[:5], base[:9] + [60]]
    run_checked(llm, model(), prompts, [_params(n) for n in (30, 24, 26, 20, 28)], on_step=on_step)
    assert checked and all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
    assert steps[-1] > 0                                       # requests were preempted
    assert_clean(llm)


def test_a_step_without_drafts_runs_no_module_and_the_plain_step_s_shapes(monkeypatch):
    """At k = 0 (requests at depth K) no draft-module forward runs and the step's shapes are a plain
    engine's (a 1-token window, the same key blocks); the first drafting step after it runs one
    catch-up round, then its draft round."""
    K = 4
    llm, policy = forced_engine("mtp8", K)
    plain = make_llm(model())
    calls, shapes = [], {}
    run_module = common.run_module

    def counted(*args, **kwargs):
        calls.append(args[2])
        return run_module(*args, **kwargs)
    for mod in ("mtpx.spec_decode.multi_module", "mtpx.spec_decode.single_module"):
        monkeypatch.setattr(f"{mod}.run_module", counted)
    from mtpx.engine import model_runner

    plan = model_runner.StepShapes.plan

    def recorded(*args, **kwargs):
        s = plan(*args, **kwargs)
        shapes.setdefault(kwargs["k"], []).append(s)
        return s
    monkeypatch.setattr(model_runner.StepShapes, "plan", staticmethod(recorded))
    per_step = []
    policy.forced = 0                   # depth K all the same (a fixed-k engine: every request max_k)

    def on_step(engine):
        per_step.append((policy.forced, len(calls)))
        calls.clear()
        policy.forced = 0 if len(per_step) < 6 else K

    run_checked(llm, model(), [[5, 9, 13, 2, 40, 41, 7]], [_params(9)], on_step=on_step)
    run_checked(plain, model(), [[5, 9, 13, 2, 40, 41, 7]], [_params(9)])
    assert [n for k, n in per_step[1:6]] == [0] * 5            # k = 0 steps: no module forward
    assert per_step[6] == (K, 2 * K)                            # catch-up round + draft round
    skip = [(s.window, s.num_blocks, s.depth) for s in shapes[K][:5]]
    assert skip == [(s.window, s.num_blocks, s.depth) for s in shapes[0][:5]]
    assert_clean(llm)


# ---- the decisions: k = 0 priced at plain decoding's step plus the catch-up it defers ----------
def _settle(p, depths, steps: int = 40) -> list[int]:
    """The k of `steps` steps of batch len(depths) (decide, commit), the deepest depth held."""
    ks = []
    for _ in range(steps):
        choice = p.decide(len(depths), max(depths), held=max(depths), depths=depths)
        p.commit(choice)
        ks.append(choice.k)
    return ks


def _policy(ms_by_k: dict[int, float], acceptance: float, catch_up_ms: float | None = None):
    p = AutoDraftLength(4, {(k, 16): ms for k, ms in ms_by_k.items()},   # every position learned
                        AutoKConfig(probe_interval=0, patient_start=True, prior_acceptance=acceptance,
                                    min_verified=0))
    for _ in range(3):          # measured catch-up rounds: ms per position and module
        if catch_up_ms is not None:
            p.observe(StepRecord(0, False, (), timed=True, catch_up_module_tokens=100,
                                 catch_up_s=catch_up_ms * 100 / 1e3))
    return p


def test_the_policy_drafts_where_it_pays_and_decodes_plainly_where_nothing_does():
    """Scripted costs at batch 16, every request at depth 4: drafting 4 at 20 ms against 12 ms plain
    with acceptance 0.8 (3.36 tokens a request) pays 2.69 tokens per ms against 1.33: k = 4 (from a
    k in use of 4 and of 0 alike); at 41 ms with acceptance 0.7 (2.77 tokens: 1.08 per ms) nothing
    pays: k = 0 after `patience` steps, and a k = 0 step is priced at plain decoding's 12 ms plus
    the catch-up it defers (16 x 4 module positions x 0.01 ms = 0.64 ms), not the held draft round."""
    depths = [4] * 16
    cheap = _policy({0: 12.0, 1: 14.0, 2: 16.0, 3: 18.0, 4: 20.0}, 0.8, catch_up_ms=0.01)
    assert set(_settle(cheap, depths)) == {4}
    cheap.k = 0
    assert _settle(cheap, depths)[-1] == 4
    dear = _policy({0: 12.0, 1: 41.0, 2: 41.0, 3: 41.0, 4: 41.0}, 0.7, catch_up_ms=0.01)
    assert dear.costs.held_cost_curve(16, 4, held_modules=64)[0] == pytest.approx(12.0 + 64 * 0.01)
    ks = _settle(dear, depths)
    assert ks[:dear.patience - 1] == [4] * (dear.patience - 1) and set(ks[dear.patience:]) == {0}


def test_a_dear_measured_catch_up_keeps_the_modules_drafting():
    """The catch-up's measured cost enters k = 0's price: drafting 4 at 34 ms with acceptance
    0.65 (2.53 tokens a request: 1.19 per ms), k = 0 wins while the catch-up costs 0.01 ms per
    module position (12.64 ms: 1.27 per ms), and k = 4 wins once the measured catch-up costs
    0.12 ms (16 x 4 x 0.12 = 7.68 ms deferred per step: 19.68 ms, 0.81 per ms)."""
    depths = [4] * 16
    table = {0: 12.0, 1: 34.0, 2: 34.0, 3: 34.0, 4: 34.0}
    light = _policy(table, 0.65, catch_up_ms=0.01)
    assert light.costs.catch_up_ms() == pytest.approx(0.01)
    assert _settle(light, depths)[-1] == 0
    heavy = _policy(table, 0.65, catch_up_ms=0.12)
    assert heavy.costs.catch_up_ms() == pytest.approx(0.12)
    assert set(_settle(heavy, depths)) == {4}


def test_the_run_estimate_prices_the_run_s_decode_steps_at_plain_decoding_and_the_best_fixed_k():
    """Ten k = 0 steps of 16 requests, 12 ms each, one token per request: the cost model's estimate
    of plain decoding over those steps is 16 / 12 ms = 1333.33 tok/s (what they measured), of
    fixed k = 4 16 x 3.3616 / 20 ms = 2689.28 (acceptance 0.8: the best fixed k), and the report
    prints both beside the measured rate."""
    p = _policy({0: 12.0, 1: 14.0, 2: 16.0, 3: 18.0, 4: 20.0}, 0.8)
    rounds = tuple(Round(i, 0, 0, 4, 10, 0, 0, 1) for i in range(16))
    for _ in range(10):
        p.observe(StepRecord(0, False, rounds, timed=True, verify_s=0.012, wall_s=0.012))
    estimate = p.summary()["run_estimate"]
    assert estimate == {"plain_tokens_per_s": 1333.33, "best_fixed_k": 4, "best_fixed_tokens_per_s": 2689.28,
                        "measured_tokens_per_s": 1333.33}
    assert format_run_estimate(estimate) == (
        "Decode tok/s, this run's steps: automatic k measured 1333.3; the cost model's estimate of plain "
        "decoding 1333.3 (1.000x) and of the best fixed k = 4 2689.3 (0.496x)")
