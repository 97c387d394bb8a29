"""Lazy catch-up (mtpx/engine/lazy_catch_up.py): a decode step without drafts runs no draft module;
the modules of a request that fell behind catch up in one round when it drafts again (or before
its ring of target hidden states overflows). Module KV exact against from-scratch (every module,
every computed position, after every step), greedy output identical to plain decoding under
forced k schedules with prefix caching and preemption, and no module forward in a step without
drafts."""
from __future__ import annotations

import pytest
import torch

from mtpx.engine.lazy_catch_up import LazyCatchUp
from mtpx.spec_decode import common
from tests.helpers import _params, assert_clean, install_draft_check, make_llm, run_checked
from tests.test_auto_k import forced_engine, model
from tests.test_reprefill import _reference_kv, kv_at


def module_progress(spec, row: int, num_tokens: int, depth: int) -> list[int]:
    """Per module m = 1..depth: the positions [0, P_m) whose KV the module computed from known
    tokens (x_{j+m} known: j < num_tokens - m; mtp1: its one module, j < num_tokens - 1)."""
    if spec.num_draft_modules == 1 and spec.computed.dim() == 1:
        return [min(int(spec.computed[row]), num_tokens - 1)]
    return [min(int(spec.computed[row, m - 1]), num_tokens - m) for m in range(1, depth + 1)]


def assert_module_kv_exact(engine, mdl, current: bool) -> None:
    """Every running request's module KV at every position its modules computed equals the
    from-scratch KV (to 1e-10, float64); current: every module reached the last position its
    inputs allow (num_tokens - m), as after a drafting step."""
    spec = engine.speculator
    for r in engine.scheduler.running:
        if r.index not in engine.runner.rows or not r.output_token_ids:
            continue
        seq, row = r.all_token_ids, engine.runner.rows[r.index]
        depth = min(r.draft_depth, spec.num_draft_modules)
        progress = module_progress(spec, row, len(seq), depth)
        ref = _reference_kv(mdl, seq, len(progress))
        for m, p in enumerate(progress):
            for got, want in zip(kv_at(engine.cache, m, row, p), kv_at(ref, m, 0, p)):
                torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
        if current:
            assert progress == [len(seq) - 1 if len(progress) == 1 and spec.computed.dim() == 1
                                else len(seq) - m for m in range(1, len(progress) + 1)], (progress, len(seq))


@pytest.mark.parametrize("spec,K,window", [("mtp8", 4, None), ("mtp8", 4, 10), ("mtp1", 3, 8)])
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
    schedule = [K] + [0] * 9 + [K, 0, 0, K - 1, 0, K] * 4
    seen = []

    def on_step(engine):
        seen.append(policy.forced)
        assert_module_kv_exact(engine, model(), current=seen[-1] > 0)
        policy.forced = schedule[len(seen) % len(schedule)]

    policy.forced = schedule[0]
    tokens_before = runner.lazy.num_module_tokens
    run_checked(llm, model(), [[5, 9, 13, 2, 40, 41, 7], [3, 8, 8, 1]], [_params(36), _params(28)],
                on_step=on_step)
    assert checked and all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
    assert runner.lazy.num_module_tokens > tokens_before      # the catch-up ran
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
