"""Dynamic (EAGLE-2) trees, `spec.tree={num_draft_tokens, depth, topk}` (mtpx/spec_decode/tree_dynamic.py):
the frontier and the budget's choice on hand-made draft logits (exact trees), and through the engine
greedy output equal to plain decoding with every proposed tree equal to the EAGLE-2 tree drafted
from scratch over the request's tokens, for mtp8 and mtp1 (the mtp1 from-scratch check is slow:
`python -m pytest -q -m slow tests/test_tree_dynamic.py`)."""
from __future__ import annotations

import pytest
import torch

from mtpx.spec_decode import SingleModuleMTPSpeculator, build_speculator
from mtpx.spec_decode.tree import DynamicTree, build_tree_shape, depth_levels
from mtpx.spec_decode import tree_dynamic
from mtpx.spec_decode.tree_draft import TreeSpeculator
from tests.helpers import _params, install_proposal_check, make_llm, run_checked
from tests.test_tree import PROMPTS, _logits_from_scratch


def _logits(rows: list[list[list[float]]]) -> torch.Tensor:
    """[B][P][V] probabilities -> logits (their logs)."""
    return torch.tensor(rows, dtype=torch.float64).log()


def test_frontier_and_budget_on_hand_made_logits():
    """depth 3, topk 2, budget 5. Root: p(7) = .6, p(3) = .3. Level 2 expands both: 7 -> {4: .9,
    5: .05}, 3 -> {4: .5, 6: .4}; cumulative .54, .03, .15, .12: frontier 7-4, 3-4. Level 3: 7-4 ->
    {1: .5, 2: .4} (.27, .216), 3-4 -> {1: .99, 2: .01} (.1485, .0015). The 5 best of all 10:
    .6 (7), .54 (7-4), .3 (3), .27 (7-4-1), .216 (7-4-2), listed breadth first."""
    tree = DynamicTree(5, 3, 2)
    g = tree_dynamic.new_round(tree, 1, "cpu")
    tree_dynamic.expand(g, tree, 1, _logits([[[0.05, 0, 0, .3, 0, 0, 0, .6, .05]]]))
    assert g.tok[0, 1:3].tolist() == [7, 3] and g.par[0, 1:3].tolist() == [0, 0]
    tree_dynamic.expand(g, tree, 2, _logits([[[.025, 0, 0, 0, .9, .05, 0, 0, .025],
                                              [.05, 0, 0, 0, .5, .05, .4, 0, 0]]]))
    assert g.tok[0, 3:5].tolist() == [4, 4] and g.par[0, 3:5].tolist() == [1, 2]      # 7-4, 3-4
    assert g.anc[0, 3].nonzero()[:, 0].tolist() == [1, 3] and g.anc[0, 4].nonzero()[:, 0].tolist() == [2, 4]
    tree_dynamic.expand(g, tree, 3, _logits([[[.05, .5, .4, 0, 0, 0, 0, 0, .05],
                                              [0, .99, .01, 0, 0, 0, 0, 0, 0]]]))
    tokens, parents, depths, ranks = tree_dynamic.select(g, tree)
    assert tokens.tolist() == [[7, 3, 4, 1, 2]]
    assert parents.tolist() == [[-1, 0, 0, 1, 3, 3]]
    assert depths.tolist() == [[0, 1, 1, 2, 3, 3]]
    assert ranks.tolist() == [[0, 0, 1, 0, 0, 1]]


def test_depth_levels_of_ragged_trees():
    assert depth_levels([[0, 1, 1, 2, 3, 3]]) == [(0, 1), (1, 3), (3, 4), (4, 6)]
    assert depth_levels([[0, 1, 1, 2, 3], [0, 1, 2, 2, 3]]) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_dynamic_settings(trained_tiny):
    assert build_tree_shape({"num_draft_tokens": 6, "depth": 3, "topk": 2}) == DynamicTree(6, 3, 2)
    assert isinstance(build_speculator("mtp8", trained_tiny, None, tree={"num_draft_tokens": 6, "depth": 3,
                                                                        "topk": 2}), TreeSpeculator)
    chain = build_speculator("mtp1", trained_tiny, None, tree={"num_draft_tokens": 3, "depth": 3, "topk": 1})
    assert type(chain) is SingleModuleMTPSpeculator and chain.num_speculative_tokens == 3      # the chain


def dynamic_tree_from_scratch(model, seq, tree: DynamicTree, multi: bool) -> list[int]:
    """EAGLE-2's tree after seq from scratch (tree_dynamic's rule on _logits_from_scratch): the
    num_draft_tokens tokens, breadth first."""
    hid = model.model(torch.tensor([seq]))[:, : len(seq) - 1]
    cands, frontier = [], [(torch.zeros((), dtype=torch.float32), [])]
    for _level in range(tree.depth):
        new = []
        for score, path in frontier:
            logp = torch.log_softmax(_logits_from_scratch(model, seq, hid, path, multi).float(), -1)
            val, ids = logp.topk(tree.topk)
            for r in range(tree.topk):
                new.append((score + val[r].clamp(max=0), path + [int(ids[r])]))
        cands += new
        frontier = sorted(new, key=lambda c: -float(c[0]))[: tree.topk]
    order = sorted(range(len(cands)), key=lambda i: -float(cands[i][0]))[: tree.num_draft_tokens]
    return [cands[i][1][-1] for i in sorted(order)]


@pytest.mark.parametrize("spec,tree", [
    ("mtp8", {"num_draft_tokens": 6, "depth": 3, "topk": 2}),
    pytest.param("mtp1", {"num_draft_tokens": 6, "depth": 3, "topk": 2}, marks=pytest.mark.slow)])
def test_dynamic_tree_equals_plain_and_drafts_exact(trained_tiny, spec, tree):
    model = trained_tiny
    prompts = PROMPTS[:5]
    params = [_params(16 - i) for i in range(len(prompts))]
    llm = make_llm(model, spec, tree=tree, max_num_seqs=4)
    shape = llm.speculator.shape
    checked = install_proposal_check(
        llm, lambda seq, got: dynamic_tree_from_scratch(model, seq, shape, spec == "mtp8")[: len(got)])
    outs, _ = run_checked(llm, model, prompts, params)
    bad = [c[1:] for c in checked if not c[0]]
    assert not bad, bad[:2]
    assert len(checked) > 15
    rounds = sum(o.spec.num_drafts for o in outs)
    assert 0 < sum(o.spec.num_accepted_tokens for o in outs) < shape.depth * rounds
    stats = llm.engine.runner.tree_stats
    assert stats.rounds == rounds and stats.nodes == sum(o.spec.num_draft_tokens for o in outs)


@pytest.mark.parametrize("spec", ["mtp1", "mtp8"])
def test_dynamic_tree_with_prefix_caching_chunking_preemption(trained_tiny, spec):
    """Chunked prefill (8 tokens a step), prefix caching, a pool one block above the largest
    request's need (both passes preempt): tokens and logit gaps equal plain decoding."""
    from tests.helpers import blocks_needed
    from tests.test_engine import shared_prefix_prompts
    model = trained_tiny
    prompts = shared_prefix_prompts()
    params = [_params(t) for t in (9, 14, 5, 12, 10, 3, 13, 8)]
    tree = {"num_draft_tokens": 5, "depth": 3, "topk": 2}
    nb = max(blocks_needed(len(p), sp.max_tokens, 5, 4) for p, sp in zip(prompts, params)) + 1
    llm = make_llm(model, spec, tree=tree, max_num_seqs=4, block_size=4, num_blocks=nb,
                   enable_prefix_caching=True, max_num_batched_tokens=8)
    run_checked(llm, model, prompts, params)
    preemptions = llm.engine.num_preemptions
    _, reqs = run_checked(llm, model, prompts, params)
    assert preemptions > 0 and llm.engine.num_preemptions > preemptions
    assert sum(r.num_cached_tokens for r in reqs.values()) > 0
