"""Ragged verification windows and per-request k (issue: the fastest engine at every concurrency).

The ragged layout (ForwardMeta.packed, EngineConfig.ragged_batch) runs the token-wise work on the
real tokens alone; it must equal the padded grid token for token and state for state. Per-request
k (AutoDraftLength.allocate) lets each request verify its own number of drafts in one step."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

from mtpx.attention.meta import ForwardMeta
from mtpx.auto_k import AutoDraftLength
from mtpx.auto_k.request_k import Allocation
from mtpx.engine.decode_step import verify_forward
from tests.helpers import _params, assert_clean, install_draft_check, make_llm, run_checked, spy
from tests.test_auto_k import model            # the peaked tiny model, built once for both files


def test_pack_and_unpack_are_inverse_on_the_real_tokens():
    meta = ForwardMeta.build(torch.tensor([3, 0, 7]), torch.tensor([2, 0, 4]), torch.tensor([0, 1, 2]))
    meta.pack_valid([2, 0, 4])
    assert meta.packed.tolist() == [0, 1, 8, 9, 10, 11]
    assert ForwardMeta.build(torch.tensor([3, 0, 7]), torch.tensor([2, 0, 4]),
                             torch.tensor([0, 1, 2])).pack_valid().packed.tolist() == [0, 1, 8, 9, 10, 11]
    x = torch.arange(3 * 4 * 2, dtype=torch.float32).view(3, 4, 2)
    packed = meta.pack(x)
    assert packed.shape == (6, 2)
    grid = meta.unpack(packed)
    assert torch.equal(grid[meta.valid], x[meta.valid]) and not grid[~meta.valid].any()


def test_a_static_token_grid_is_padded_with_distinct_padding_positions():
    """pack_valid with num_tokens (the compiled step's token grid): the real tokens first, then
    the grid's first padding positions, each once; a static meta keeps no packed_lengths."""
    meta = ForwardMeta.build(torch.tensor([3, 0, 7, 0]), torch.tensor([2, 1, 4, 0]), torch.arange(4),
                             num_tokens=4, pad_slot=0)
    meta.pack_valid([2, 1, 4], num_tokens=10)
    assert meta.packed.tolist() == [0, 1, 4, 8, 9, 10, 11, 2, 3, 5]
    assert meta.static and meta.packed_lengths is None
    x = torch.arange(1, 4 * 4 + 1, dtype=torch.float32).view(4, 4)
    grid = meta.unpack(meta.pack(x))
    picked = torch.zeros(16, dtype=torch.bool)
    picked[meta.packed] = True
    assert torch.equal(grid.flatten()[picked], x.flatten()[picked]) and not grid.flatten()[~picked].any()
    assert meta.pack_valid([2, 1, 4], num_tokens=7).packed.tolist() == [0, 1, 4, 8, 9, 10, 11]


@pytest.mark.parametrize("keep_states,token_grid", [(True, None), (True, 8), (False, None)])
def test_a_ragged_verification_forward_equals_the_padded_grid(keep_states, token_grid):
    """The target over windows of 1, 4 and 2 tokens: hidden states, logits, the KV written and
    the Gated DeltaNet windows kept (or states stored) equal the grid's; token_grid: the packed
    forward runs on that many tokens (the compiled step's on CUDA), its padding never read."""
    llm = make_llm(model(), "mtp8", 4, max_num_seqs=4, check_invariants=False)
    cache = llm.engine.runner.cache
    for row in range(3):
        cache.set_block_table(row, [1 + 2 * row, 2 + 2 * row])
    rows, n = torch.tensor([0, 1, 2]), torch.tensor([5, 9, 3])
    lengths = [1, 4, 2] if keep_states else [1, 1, 1]
    out, states = {}, {}
    with torch.inference_mode():
        for ragged in (False, True):
            for c in cache.recurrent:
                c.ssm.zero_()
                c.conv.zero_()
            meta = cache.static_meta(n, torch.tensor(lengths), rows, 4 if keep_states else 1, 2,
                                     keep_states=keep_states)
            if ragged:
                meta.pack_valid(lengths, token_grid)
            ids, h, logits = verify_forward(llm.model, cache, meta)
            out[ragged] = (h[meta.valid], logits[meta.valid])
            kv = [torch.stack([c.k.flatten(0, 1)[meta.slot_mapping[meta.valid]] for c in cache.target
                               if hasattr(c, "k")])]
            group = cache.recurrent[0].group
            # a window's kept entries at its real tokens (padding's are never read)
            kept = ([w[:, b, :, :n].clone() for w in group.windows(max(lengths))[:3]
                     for b, n in enumerate(lengths)]
                    if keep_states else [group.ssm[:, :3].clone(), group.conv[:, :3].clone()])
            states[ragged] = kv + kept
    for a, b in zip(out[False] + tuple(states[False]), out[True] + tuple(states[True])):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


class ScriptedAllocation(AutoDraftLength):
    """Per-request k from a seeded random draw: each decode verifies 0 .. all of its drafts; every
    step proposes max_k (each request up to its depth); depths from `depths` at admission."""

    def __init__(self, max_k: int, depths, seed: int):
        super().__init__(max_k)
        self.forced = max_k
        self.depths = iter(depths)
        self.rng = random.Random(seed)
        self.per_request = True

    def depth(self, batch_size: int, current: int | None = None, depths=None, prompt_tokens: int = 0,
              max_tokens: int | None = None) -> int:
        return next(self.depths, self.max_k) if current is None else current

    def allocate(self, requests):
        ks = [self.rng.randint(0, n) for _, n in requests]
        self.mixed = getattr(self, "mixed", False) or len(set(ks)) > 1
        return Allocation(ks, sum(ks) / len(ks), 0.0, 0.0)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(depths=[4] * 8, prefix=True, small_pool=True, seed=1)
@given(depths=st.lists(st.integers(0, 4), min_size=8, max_size=8), prefix=st.booleans(),
       small_pool=st.booleans(), seed=st.integers(0, 5))
def test_per_request_k_ragged_equals_padded_and_plain_decoding(depths, prefix, small_pool, seed):
    """Requests verifying different numbers of drafts in one step (0 .. their depth, drawn per
    step), with prefix caching, preemption (a small pool) and stop tokens: greedy output identical
    to plain decoding with the ragged layout and with the padded grid, and every proposal equal
    to the from-scratch drafts (the draft modules' KV exact)."""
    g = random.Random(seed)
    base = [g.randrange(2, 64) for _ in range(14)]
    prompts = [base[:9] + [g.randrange(2, 64) for _ in range(3)], base, base[:5] + [7, 8], base[:13]]
    params = [_params(g.randrange(5, 25), stop=g.choice([None, base[3]])) for _ in prompts]
    results, packed = {}, []
    pack_valid = ForwardMeta.pack_valid
    ForwardMeta.pack_valid = lambda self, *a: (packed.append(1), pack_valid(self, *a))[1]
    try:
        for ragged in (True, False):
            _run(ragged, depths, prefix, small_pool, seed, prompts, params, results)
            if ragged:
                assert packed or max(depths) == 0
    finally:
        ForwardMeta.pack_valid = pack_valid
    assert results[True] == results[False]


def _run(ragged, depths, prefix, small_pool, seed, prompts, params, results):
    """One engine (ragged or padded) over the workload with scripted per-request ks."""
    K = 4
    kw = dict(num_blocks=14) if small_pool else {}
    llm = make_llm(model(), "mtp8", K, enable_prefix_caching=prefix, max_num_seqs=3, block_size=4,
                   ragged_batch=ragged, **kw)
    policy = ScriptedAllocation(K, depths, seed)
    llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
    llm.engine.scheduler.depth_per_request = True
    checked = install_draft_check(llm, model(), "mtp8", K)
    outs, _ = run_checked(llm, model(), prompts, params)
    assert all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
    assert sum(policy.per_request_k.verified_histogram.values()) > 0
    if all(d == 4 for d in depths):
        assert policy.mixed                 # requests verified different numbers in a step
    results[ragged] = [o.output_token_ids for o in outs]
    assert_clean(llm)


def _policy(costs_at_2: list[float]) -> AutoDraftLength:
    policy = AutoDraftLength(4, {(k, b): c for k, c in enumerate(costs_at_2) for b in (2,)})
    policy.per_request, policy.per_request_k.explore = True, False
    return policy


def test_allocate_gives_drafts_to_the_request_that_accepts_them():
    """Step ms 10 + 2 k at batch 2 (ragged_cost(x) = 10 + 2 x): request "a" accepted every draft
    of 20 rounds, "b" none; a keeps all 4 drafts held, b none."""
    policy = _policy([10, 12, 14, 16, 18])
    assert policy.ragged_cost(1.5, 2) == pytest.approx(13.0)
    for _ in range(20):
        policy.observe_round(4, 4, "a")
        policy.observe_round(4, 0, "b")
    pa, pb = policy.request_acceptance("a"), policy.request_acceptance("b")
    w, p = policy.per_request_k.requests.prior_weight, policy.acceptance
    assert pa[0] == pytest.approx((20 + w * p[0]) / (20 + w)) and pb[0] == pytest.approx(w * p[0] / (20 + w))
    assert pb[1] == pytest.approx(p[1])          # b never reached position 2: the engine-wide estimate
    alloc = policy.allocate([("a", 4), ("b", 4)])
    assert alloc.num_drafts == [4, 0]
    s, want = 1.0, 2.0
    for x in pa:
        s *= x
        want += s
    assert alloc.expected_tokens == pytest.approx(want)
    assert alloc.predicted_ms == pytest.approx(10 + 2 * 4 / 2) and alloc.mean_drafts == 2.0
    assert policy.allocate([("a", 2), ("b", 4)]).num_drafts == [2, 0]     # never more than held
    # drafts too expensive to pay: nobody verifies
    assert _policy([10, 30, 50, 70, 90]).allocate([("a", 4), ("b", 4)]).num_drafts == [0, 0]
    policy.forget("a")
    assert policy.request_acceptance("a") == policy.acceptance


def test_the_engine_runs_per_request_k_eager_and_logs_each_ragged_step(tmp_path, monkeypatch):
    """Automatic k on an eager engine with engine.per_request_k: each pure decode step
    logged with the allocation it was chosen with against its measured ms (scripted clock: a step
    that drafts reads 3000 ms) and the tokens it committed; greedy output as plain decoding."""
    from mtpx.auto_k.store import save_step_costs
    n = len(model().mtp)
    save_step_costs(tmp_path / "costs.json", {(k, b): 3000.0 for k in range(n + 1) for b in (1, 2, 3, 4)}, {})
    llm = make_llm(model(), "mtp8", "auto", max_num_seqs=4, cost_model_file=tmp_path / "costs.json",
                   per_request_k=True)
    policy, clock = llm.engine.draft_length, iter(range(10 ** 6))
    assert policy.per_request
    for kw in (dict(per_request_k=True, ragged_batch=False), {}):     # needs ragged steps; off by default
        assert not make_llm(model(), "mtp8", "auto", max_num_seqs=4, cost_model_file=tmp_path / "costs.json",
                            **kw).engine.draft_length.per_request
    monkeypatch.setattr(llm.engine.runner, "_now", lambda: float(next(clock)))
    seen = spy(monkeypatch, policy.costs, "observe_allocation")
    prompts = [[(7 * i + j) % 60 + 2 for j in range(5 + 3 * i)] for i in range(6)]
    run_checked(llm, model(), prompts, [_params(30)] * len(prompts))
    assert seen and all(ms == 3000.0 for _, ms, _ in seen)
    # flat costs: every draft held pays, so each request verifies all it holds
    assert all(a.num_drafts and a.predicted_ms == 3000.0 for a, _, _ in seen)
    summary = policy.summary()
    assert summary["per_request"] and sum(summary["verified_histogram"].values()) > 0
    log = summary["cost_model"]
    assert sum(r["steps"] for r in log.values()) == len(seen)
    assert_clean(llm)


def test_the_step_overhead_is_learned_per_batch_bucket_and_added_to_every_k():
    """observe_overhead: the median of the last cost_window steps, per batch bucket;
    step_cost_curve adds it to cost_curve's every k, and goodput uses it."""
    policy = _policy([10, 12, 14, 16, 18])
    policy.cost_window = 3
    assert policy.costs.step_cost_curve(2) == policy.costs.cost_curve(2)            # nothing learned yet
    policy.costs.observe_overhead(2, 4.0)
    policy.costs.observe_overhead(3, 8.0)                                     # bucket 2-3 as well
    assert [(b, m.value, m.count) for b, m in policy.costs.overhead.items()] == [(2, 6.0, 2)]
    policy.costs.observe_overhead(2, 2.0)                                     # the median of 4, 8 and 2
    assert [(b, m.value, m.count) for b, m in policy.costs.overhead.items()] == [(2, 4.0, 3)]
    assert policy.costs.step_cost_curve(2) == [c + 4.0 for c in policy.costs.cost_curve(2)]
    assert policy.goodput(0, 2) == pytest.approx(2 / 14.0)
    assert (policy.ragged_cost(0.5, 2) == pytest.approx(15.0)
            and policy.ragged_cost(0.5, 2, overhead=False) == 11.0)
    assert policy.costs.step_cost_curve(1) == policy.costs.cost_curve(1)            # another bucket: none


def test_thompson_draws_tighten_with_the_rounds_seen():
    """request_k.draw_engine_wide and RequestEstimates.sample: with 10,000 rounds at acceptance
    0.8 every draw is within 0.02 of it; with none they spread around the prior (seeded, so the
    same draws every run)."""
    import random as _random
    from mtpx.auto_k.request_k import RequestEstimates, draw_engine_wide
    rng = _random.Random(1)
    sure = [draw_engine_wide([8000.0, 6400.0], [10000.0, 8000.0], 0.7, 8.0, rng) for _ in range(200)]
    assert all(abs(p1 - 0.8) < 0.02 and abs(p2 - 0.8) < 0.02 for p1, p2 in sure)
    unsure = [draw_engine_wide([0.0, 0.0], [0.0, 0.0], 0.7, 8.0, rng)[0] for _ in range(200)]
    mean = sum(unsure) / len(unsure)
    assert abs(mean - 0.7) < 0.05 and max(unsure) - min(unsure) > 0.4
    est = RequestEstimates(2, seed=3)
    for _ in range(5000):
        est.observe("r", 2, 1)                   # position 1 always accepted, position 2 never
    draws = [est.sample("r", [0.5, 0.5]) for _ in range(100)]
    assert all(p1 > 0.99 and p2 < 0.01 for p1, p2 in draws)
    assert (RequestEstimates(2, seed=3).sample("new", [0.5, 0.5])
            == RequestEstimates(2, seed=3).sample("new", [0.5, 0.5]))


@pytest.mark.parametrize("token_multiple", [1, pytest.param(4, marks=pytest.mark.slow)])   # 30 s each
def test_compiled_ragged_windows_equal_padded_windows(monkeypatch, token_multiple):
    """The compiled step (Dynamo, eager backend) with per-request ks drawn every step and depths
    0 .. 4: its verification windows run packed (fewer tokens than the padded grid, the count a
    dynamic size: a second workload with other counts compiles nothing), and greedy output equals
    the eager padded grid's and plain decoding's, every proposal the from-scratch drafts.
    token_multiple 4: the packed tokens padded to a multiple of 4 (CUDA's token grid uses 8)."""
    from mtpx.engine.compiled import CompiledDecode
    torch._dynamo.reset()
    if token_multiple > 1:
        monkeypatch.setattr(CompiledDecode, "packed_tokens",
                            lambda self, n, grid: min(grid, -(-n // token_multiple) * token_multiple))
    sizes = []
    pack_valid = ForwardMeta.pack_valid
    monkeypatch.setattr(ForwardMeta, "pack_valid", lambda self, lengths=None, num_tokens=None: (
        sizes.append((num_tokens, self.positions.numel(), sum(lengths))),
        pack_valid(self, lengths, num_tokens))[1])
    g = random.Random(0)
    prompts = [[g.randrange(2, 64) for _ in range(n)] for n in (9, 4, 13, 6, 11)]
    params = [_params(18 - 2 * i) for i in range(len(prompts))]
    outs = {}
    for compiled in (False, True):
        llm = make_llm(model(), "mtp8", 4, max_num_seqs=4, ragged_batch=compiled, compile=compiled,
                       compile_backend="eager", check_invariants=False)
        policy = ScriptedAllocation(4, [4, 2, 0, 4, 3], seed=1)
        llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
        llm.engine.scheduler.depth_per_request = True
        checked = install_draft_check(llm, model(), "mtp8", 4)
        outs[compiled] = [o.output_token_ids for o in run_checked(llm, model(), prompts, params)[0]]
        assert all(c[0] for c in checked)
    assert outs[True] == outs[False]
    static = [(n, grid, real) for n, grid, real in sizes if n is not None]
    assert static and all(n == min(grid, -(-real // token_multiple) * token_multiple)
                          for n, grid, real in static)
    assert any(n < grid for n, grid, _ in static)
    graphs, seen = llm.engine.compiled.num_graphs, len(sizes)
    assert len({n for n, _, _ in static}) >= 3
    policy.depths, policy.rng = iter([1, 4, 4, 2, 0]), random.Random(7)
    with torch._dynamo.config.patch(error_on_recompile=True):
        llm.generate(prompts, params)
    assert len(sizes) > seen and llm.engine.compiled.num_graphs == graphs
