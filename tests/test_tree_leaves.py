"""Leaf trees ("chain + leaves", mtpx/spec_decode/tree_leaves.py) drafted by the chain speculator's
round: the shape's property, the speculator chosen for it, and on the float64 tiny hybrid (mtp8 and
mtp1) greedy output equal to plain decoding, every proposed tree equal to the one the generic tree
round (TreeSpeculator) proposes at the same step (which tests/test_tree.py checks against the tree
drafted from scratch), and after every step the module KV at every position the modules computed
equal to a from-scratch run over the accepted tokens (tests/test_reprefill.py's standard) -- which
fails without the re-prefill of the positions that read a replaced chain draft (`settle`). Prefix
caching, preemption, chunked prefill, stops, abort and random workloads: the leaf shapes in
tests/test_tree.py's parametrizations; compiled: tests/test_tree_compiled.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mtpx.spec_decode import build_speculator, tree_leaves
from mtpx.spec_decode.tree import build_tree_shape
from mtpx.spec_decode.tree_draft import TreeSpeculator
from mtpx.spec_decode.tree_leaves import LeafTreeSpeculator
from tests.helpers import _params, install_proposal_check, make_llm, run_checked
from tests.test_reprefill import assert_module_kv_exact
from tests.test_tree import PROMPTS

MTP8_LEAVES = [[0], [1], [2], [0, 0], [0, 1], [0, 0, 0], [0, 0, 1]]        # chain 3 + (1,1) (1,2) (2,1) (3,1)
MTP1_LEAVES = [[0], [1], [0, 0], [0, 1], [0, 0, 0], [0, 0, 1]]             # chain 3 + (1,1) (2,1) (3,1)


def test_leaf_tree_shapes_and_their_speculator(trained_tiny):
    assert build_tree_shape(MTP8_LEAVES).is_leaf_tree and build_tree_shape([1, 1, 3]).is_leaf_tree
    assert build_tree_shape([3]).is_leaf_tree
    assert not build_tree_shape([2, 1]).is_leaf_tree                      # [1, 0]: a child of a rank-1 node
    assert not build_tree_shape([[0], [1], [0, 0], [1, 0]]).is_leaf_tree
    spec = build_speculator("mtp8", trained_tiny, None, tree=MTP8_LEAVES)
    assert type(spec) is LeafTreeSpeculator and spec.base.num_speculative_tokens == 3
    assert spec.num_speculative_tokens == 7 and spec.num_lookahead_tokens == 3
    assert type(build_speculator("mtp8", trained_tiny, None, tree=[2, 1])) is TreeSpeculator
    assert type(build_speculator("mtp1", trained_tiny, None, tree=[1, 1, 3])) is LeafTreeSpeculator


def _proposals(llm) -> list:
    """Every proposal of the engine's steps as (tokens after the step, drafts)."""
    seen = []
    install_proposal_check(llm, lambda seq, got: seen.append((tuple(seq), list(got))) or got)
    return seen


@pytest.mark.parametrize("spec,tree", [("mtp8", MTP8_LEAVES), ("mtp1", MTP1_LEAVES)])
def test_leaf_tree_equals_generic_tree_and_keeps_module_kv_exact(trained_tiny, spec, tree, monkeypatch):
    """Greedy output equals plain decoding; every tree equals the generic round's at the same step;
    module KV exact after every step (and some accepted paths end in a leaf)."""
    model = trained_tiny
    params = [_params(13 - i) for i in range(3)]
    monkeypatch.setattr(tree_leaves, "use_leaves", False)
    generic = make_llm(model, spec, tree=tree, max_num_seqs=4)
    assert type(generic.speculator) is TreeSpeculator
    want = _proposals(generic)
    run_checked(generic, model, PROMPTS[:3], params)
    monkeypatch.setattr(tree_leaves, "use_leaves", True)
    llm = make_llm(model, spec, tree=tree, max_num_seqs=4)
    got = _proposals(llm)
    steps = []
    run_checked(llm, model, PROMPTS[:3], params, on_step=lambda e: steps.append(_check_kv(e, model)))
    assert len(got) > 8 and got == want
    assert len(steps) > 4
    ranks = llm.engine.runner.tree_stats.rank_counts
    assert sum(sum(row[1:]) for row in ranks) > 0          # leaves accepted (the settle case ran)


def _check_kv(engine, model) -> None:
    spec = engine.runner.speculator
    view = SimpleNamespace(num_draft_modules=spec.num_draft_modules, computed=spec.base.computed)
    running = [r for r in engine.scheduler.running if r.num_tokens > spec.shape.depth + 1]
    assert_module_kv_exact(SimpleNamespace(speculator=view, scheduler=SimpleNamespace(running=running),
                                           runner=engine.runner, cache=engine.cache), model, current=True)


def test_without_the_settle_module_kv_goes_stale(trained_tiny, monkeypatch):
    """The test above can fail: without marking the positions that read a replaced chain draft,
    the mtp8 modules keep stale KV after an accepted leaf."""
    monkeypatch.setattr(LeafTreeSpeculator, "settle", lambda *a: None)
    model = trained_tiny
    llm = make_llm(model, "mtp8", tree=MTP8_LEAVES, max_num_seqs=4)
    with pytest.raises(AssertionError):
        llm.generate(PROMPTS[:5], [_params(16 - i) for i in range(5)], on_step=lambda e: _check_kv(e, model))
