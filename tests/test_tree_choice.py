"""The automatic choice between chain and tree (`num_speculative_tokens=auto` with a leaf
`spec.tree`: mtpx/auto_k/tree_choice.py, mtpx/engine/tree_choice.py). On the float64 tiny hybrid,
with the choice switching between chain steps (k = 0 .. max_k) and tree steps on a forced
schedule: greedy output equal to plain decoding and the module KV after every step equal to a
from-scratch run over the accepted tokens (tests/test_reprefill.py's standard), mtp8 and mtp1; with
prefix caching, chunked prefill and preemption (mtp1). The policy on scripted costs and
acceptance: the tree where it pays, the chain where it does not, exploring at most its share of
the steps. Unsupported shapes: one line naming the key.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mtpx.auto_k.store import save_step_costs
from mtpx.auto_k.tree_choice import AutoChainOrTree, LeafTree
from mtpx.core.step_plan import Round, StepRecord, StepView
from tests.helpers import _params, make_llm, run_checked
from tests.test_reprefill import assert_module_kv_exact
from tests.test_tree import PROMPTS

MTP8_LEAVES = [[0], [1], [0, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]]     # the tiny model's 4 modules + 2 leaves
MTP1_LEAVES = [[0], [1], [2], [0, 0], [0, 1], [0, 0, 0]]              # 3 deep, under mtp1's max k of 4


def _costs(path):
    """A step-cost file under which drafting pays (no start-up calibration)."""
    save_step_costs(path, {(k, b): (10.0 + 1.0 * k) * (1 + 0.05 * b) for k in range(5) for b in (1, 8)}, {})
    return path


def _check_kv(engine, model) -> None:
    spec = engine.runner.speculator                    # the chain speculator, whose state the tree shares
    running = [r for r in engine.scheduler.running if r.num_tokens > spec.num_speculative_tokens + 1]
    assert_module_kv_exact(SimpleNamespace(speculator=spec, scheduler=SimpleNamespace(running=running),
                                           runner=engine.runner, cache=engine.cache), model, current=False)


def run_switching(llm, model) -> None:
    """Three requests on the forced schedule tree, tree, chain k, ... with k cycling through 0, 2 and
    max_k (depths stay D: a tree needs them): outputs equal plain decoding's (run_checked), module KV
    exact after every step, and every switch between the forms ran."""
    policy = llm.engine.draft_length
    policy.forced_tree = lambda step: step % 6 in (1, 2, 4)
    policy.forced, policy.forced_depth = policy.max_k, policy.max_k
    forms = []

    def on_step(engine):
        forms.append(policy._forms)
        policy.forced = (0, 2, policy.max_k)[len(forms) % 3]
        _check_kv(engine, model)
    run_checked(llm, model, PROMPTS[:3], [_params(14 - i) for i in range(3)], on_step=on_step)
    assert {(False, True), (True, False), (True, True), (False, False)} <= set(forms)    # every switch ran


@pytest.mark.parametrize("spec,tree", [("mtp8", MTP8_LEAVES), ("mtp1", MTP1_LEAVES)])
def test_switching_chain_and_tree_keeps_greedy_output_and_module_kv(trained_tiny, spec, tree, tmp_path):
    """Forced schedule: tree, tree, chain k, ... with k cycling through 0, 2 and max_k, so every
    switch (chain k = 0 -> tree included) occurs; output equal to plain decoding, module KV exact
    after every step, tree steps and accepted leaves counted."""
    model = trained_tiny
    llm = make_llm(model, spec, "auto", tree=tree, max_num_seqs=3, enable_prefix_caching=True,
                   cost_model_file=_costs(tmp_path / "costs.json"))
    policy, runner = llm.engine.draft_length, llm.engine.runner
    assert isinstance(policy, AutoChainOrTree) and runner.choice is not None
    run_switching(llm, model)
    stats = runner.tree_stats
    assert stats.rounds > 5 and sum(sum(row[1:]) for row in stats.rank_counts) > 0      # leaves accepted
    assert policy.tree_rounds == stats.rounds


def test_the_check_can_fail_without_the_tree_settle(trained_tiny, tmp_path, monkeypatch):
    """The module KV check above can fail: without the leaf tree's settle (marking the positions
    that read a replaced chain draft) the shared modules keep stale KV."""
    from mtpx.spec_decode.tree_leaves import LeafTreeSpeculator
    monkeypatch.setattr(LeafTreeSpeculator, "settle", lambda *a: None)
    model = trained_tiny
    llm = make_llm(model, "mtp8", "auto", tree=MTP8_LEAVES, max_num_seqs=4,
                   cost_model_file=_costs(tmp_path / "costs.json"))
    policy = llm.engine.draft_length
    policy.forced_tree, policy.forced, policy.forced_depth = (lambda step: True), 4, 4
    with pytest.raises(AssertionError):
        llm.generate(PROMPTS[:5], [_params(16 - i) for i in range(5)], on_step=lambda e: _check_kv(e, model))


def _policy(tree_ms: float, leaf_wins: float, rounds: int = 200) -> AutoChainOrTree:
    """max k 4, a leaf tree of 6 nodes 4 deep with leaves at depths 1 and 2; chain k costs 10 + k
    ms at batch 1, every draft accepted with p = 0.6; `rounds` tree rounds observed, of which the
    chain part stopped at depth 1 or 2 and a leaf won with probability leaf_wins; tree steps of
    tree_ms."""
    p = AutoChainOrTree(4, LeafTree.of(MTP8_LEAVES), step_costs={(k, 1): 10.0 + k for k in range(5)})
    for i in range(rounds):
        c = i % 2                                          # stopped after 0 or 1 chain drafts
        won = leaf_wins > 0 and (i // 2) % round(1 / leaf_wins) == 0
        p._chain_part(Round(i, 6, 6, 4, 10, 6, c + won, c + won + 1, leaf_rank=int(won)))
    p.tree_ms[1] = SimpleNamespace(value=tree_ms)
    p.acceptance = [0.6] * 4
    return p


def _plan(p: AutoChainOrTree, steps: int) -> list[bool]:
    view = StepView(1, False, (4,), ((0, 4),), (), lambda depth, freed: False)
    return [p.plan(view).tree for _ in range(steps)]


def test_policy_picks_the_tree_where_it_pays_and_the_chain_where_not():
    """E_tree = E[tokens | 4] + P(stop after 0) q_0 + P(stop after 1) q_1 = 2.3056 + 0.4 q_0 +
    0.24 q_1, q_c about 0.5 (the discounted counts with the prior): about 2.6; the best chain is
    k = 3, 2.176 tokens in 13 ms (0.1674 per ms). A 14 ms tree (about 0.186) is chosen after
    `patience` steps; a 20 ms tree (about 0.13) never (learned: no exploring within `refresh`)."""
    pays = _policy(14.0, 0.5)
    assert pays.hits[0] / pays.stops[0] == pytest.approx(0.5, abs=0.02)
    q = [pays.leaf_rate(c) for c in range(4)]
    assert q[2] == q[3] == 0.0 and 0.4 < q[0] < 0.5 and 0.4 < q[1] < 0.5         # no leaf at depths 3, 4
    assert pays.tree_tokens() == pytest.approx(2.3056 + 0.4 * q[0] + 0.24 * q[1])
    assert pays.tree_goodput(1) > 1.05 * max(pays.goodput(k, 1) for k in range(5))
    picks = _plan(pays, 20)
    assert picks[:pays.patience - 1] == [False] * (pays.patience - 1) and all(picks[pays.patience - 1:])
    slow = _policy(20.0, 0.5)
    assert slow.tree_goodput(1) < max(slow.goodput(k, 1) for k in range(5))
    assert not any(_plan(slow, slow.refresh - 1))


def test_policy_explores_an_unlearned_tree_within_its_share():
    """Nothing learned of the tree (its pessimistic priors lose): it is tried in bursts of `burst`
    steps, at most explore_share of the steps planned."""
    p = _policy(0.0, 0.0, rounds=0)
    p.tree_ms.clear()
    picks = _plan(p, 400)
    assert 0 < sum(picks) <= p.explore_share * 400 + p.burst
    first = picks.index(True)
    assert picks[first:first + p.burst] == [True] * p.burst


def test_policy_learns_the_tree_steps_cost_and_the_chain_part():
    """observe: a steady tree step (tree verified, tree proposed) gives the tree's cost sample; its
    rounds teach automatic k the chain part (accepted drafts before the leaf) and count the leaf."""
    p = AutoChainOrTree(4, LeafTree.of(MTP8_LEAVES), step_costs={(k, 1): 10.0 + k for k in range(5)})
    p.forced_tree = lambda step: True
    _plan(p, 2)
    assert p._forms == (True, True)
    observed = []
    p.observe_round = lambda nd, acc, key=None, age=None: observed.append((nd, acc))
    p.observe(StepRecord(6, False, (Round(0, 6, 6, 4, 10, 6, 2, 3, leaf_rank=1),), timed=True,
                         verify_s=0.012, draft_s=0.003, wall_s=0.016))
    assert p.tree_ms[1].value == pytest.approx(15.0) and observed == [(4, 1)]
    assert p.rank_counts[1] == [0, 1] and p.stops[1] == 1 and p.hits[1] == 1


@pytest.mark.parametrize("tree,spec,message", [
    ([[0], [1], [1, 0]], "mtp8", "give a leaf tree"),
    ({"num_draft_tokens": 4, "depth": 2, "topk": 2}, "mtp8", "give a leaf tree"),
    ([1, 1, 1, 1], "mtp8", "give a leaf tree"),
    ([[0], [1], [0, 0]], "mtp8", "must be exactly 4 deep"),
    ([1, 1, 1, 1, 2], "mtp1", "must be at most 4 deep"),
])
def test_unsupported_trees_are_refused_in_one_line(trained_tiny, tree, spec, message):
    with pytest.raises(ValueError, match="spec.tree with spec.num_speculative_tokens=auto") as e:
        make_llm(trained_tiny, spec, "auto", tree=tree)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow          # 10-40 s on 2 shared cores: python -m pytest -m slow tests/test_tree_choice.py
def test_switching_with_prefix_caching_chunking_preemption(trained_tiny, tmp_path):
    """mtp1 switching chain and tree in a pool one block above the largest request's need, chunked
    prefill (8 tokens a step), prefix caching on: tokens equal plain decoding, requests preempted."""
    from tests.helpers import blocks_needed
    from tests.test_tree import shared_prefix_prompts
    model, prompts = trained_tiny, shared_prefix_prompts()
    params = [_params(t) for t in (9, 14, 5, 12, 10, 3, 13, 8)]
    nb = max(blocks_needed(len(p), sp.max_tokens, len(MTP1_LEAVES), 4) for p, sp in zip(prompts, params)) + 1
    llm = make_llm(model, "mtp1", "auto", tree=MTP1_LEAVES, max_num_seqs=4, block_size=4, num_blocks=nb,
                   enable_prefix_caching=True, max_num_batched_tokens=8,
                   cost_model_file=_costs(tmp_path / "costs.json"))
    policy = llm.engine.draft_length
    policy.forced_tree, policy.forced = (lambda step: step % 4 in (1, 2)), 3
    run_checked(llm, model, prompts, params)
    assert llm.engine.num_preemptions > 0 and policy.tree_steps > 3
    assert llm.engine.runner.tree_stats.rounds > 3


def test_seeded_sampling_is_plain_seeded_whichever_form_runs(trained_tiny, tmp_path, monkeypatch):
    """A seeded request at temperature 1.0 / top-p 0.9, among seeded and greedy batch-mates, emits
    plain seeded sampling's tokens while the choice switches between chain and tree steps: the
    chain steps verify with one uniform per output position (engine/tree_choice.py verify_with).
    With the chain's token-level verification in the same schedule it does not."""
    from mtpx import LLM, SamplingParams
    mine = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    others = [SamplingParams(max_tokens=12, temperature=0.0 if i == 0 else 0.8, seed=i, ignore_eos=True)
              for i in range(2)]
    plain = LLM(model=trained_tiny).generate([PROMPTS[0]], [mine])[0].output_token_ids

    def run(method: str) -> tuple[list[int], int]:
        llm = make_llm(trained_tiny, "mtp8", "auto", tree=MTP8_LEAVES, max_num_seqs=3,
                       cost_model_file=_costs(tmp_path / f"costs_{method}.json"))
        policy, runner = llm.engine.draft_length, llm.engine.runner
        policy.forced_tree = lambda step: step % 3 == 1
        policy.forced, policy.forced_depth = policy.max_k, policy.max_k
        assert runner._verify_with[0] == "position"
        runner._verify_with = (method, runner._verify_with[1])
        out = llm.generate([PROMPTS[0]] + PROMPTS[1:3], [mine] + others)
        return out[0].output_token_ids, runner.tree_stats.rounds

    tokens, tree_rounds = run("position")
    assert tree_rounds > 2 and tokens == plain
    assert run("standard")[0] != plain
