"""Tree drafting (`spec.tree`, docs/trees.md): shapes and their errors, the tree algebra, and the
engine's invariants with trees: greedy output equal to plain decoding (tokens, and the top-2
logit gap of every token, which exposes Gated DeltaNet state errors too small to flip an argmax)
on the float64 tiny hybrid and a dense target, with prefix caching, chunked prefill, preemption,
stops and abort; each proposed tree equal to the tree drafted from scratch over the request's
tokens (so the module KV and hidden states the modules read were exact).

The from-scratch check of mtp1 trees and of a tree of paths and the acceptance comparison are
marked slow: `python -m pytest -q -m slow tests/test_tree.py` (MTPX_TREE_EXAMPLES sets the random
workloads' examples, 6 by default)."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings, strategies as st

from mtpx import LLM, SamplingParams
from mtpx.engine.config import EngineConfig
from mtpx.spec_decode import MultiModuleMTPSpeculator, SingleModuleMTPSpeculator, build_speculator
from mtpx.spec_decode.tree import ancestor_mask, build_tree_shape, greedy_walk
from mtpx.spec_decode.tree_draft import TreeSpeculator
from tests.helpers import (LLAMA_FLAGS, _params, assert_clean, assert_matches_reference, blocks_needed,
                           install_proposal_check,
                           generate, make_llm, reference, run_checked, train_tiny)
from tests.test_engine import _min_hit_blocks, shared_prefix_prompts, workloads

TREES = [("mtp1", [2, 2, 1]), ("mtp8", [2, 2, 1]), ("mtp8", [[0], [1], [2], [0, 0], [0, 0, 0], [1, 0]])]


# ---- shapes -------------------------------------------------------------------------------------
def test_shapes_from_widths_and_paths():
    s = build_tree_shape([2, 2, 1])
    assert s.num_nodes == 10 and s.depth == 3 and s.widths == [2, 2, 1]
    assert s.parents == [-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6]
    assert s.depths == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert s.ranks == [0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0]
    c = build_tree_shape([[0, 0], [1], [0]])                  # paths in any order: breadth first
    assert c.paths == ((0,), (1,), (0, 0)) and c.parents == [-1, 0, 0, 1]
    assert build_tree_shape([1, 1, 1]) is None and build_tree_shape([[0], [0, 0]]) is None   # chains


@pytest.mark.parametrize("value,modules,message", [
    ([4, 0, 1], None, r"spec.tree=\[4, 0, 1\]: every width must be >= 1"),
    ([[0], [0, 1]], None, r"spec.tree: path \[0, 1\] without its better-ranked sibling \[0, 0\]"),
    ([[0], [1, 0]], None, r"spec.tree: path \[1, 0\] has no parent path \[1\]"),
    ([2, 1, 1], 2, r"spec.tree is 3 deep but the model has 2 MTP modules"),
    ("wide", None, r"spec.tree='wide': give a list of widths"),
    ({"num_draft_tokens": 11, "depth": 3, "topk": 2}, None,
     r"spec.tree.num_draft_tokens=11 exceeds the 10 nodes that depth 3 and topk 2 draft"),
    ({"num_draft_tokens": 5, "depth": 4, "topk": 2}, None,
     r"spec.tree.num_draft_tokens=5 is below topk \* \(depth - 1\) = 6"),
    ({"num_draft_tokens": 8, "depth": 4, "topk": 0}, None, r"spec.tree.topk=0: must be an integer >= 1"),
    ({"num_draft_tokens": 3, "depth": 4, "topk": 2}, None,
     r"spec.tree.num_draft_tokens=3 is smaller than spec.tree.depth=4: the budget must hold"),
    ({"num_draft_tokens": 8, "depth": 5, "topk": 2}, 4, r"spec.tree.depth=5 but the model has 4 MTP modules"),
    ({"num_draft_tokens": 8, "depth": 4}, None, r"spec.tree.topk is missing"),
    ({"num_draft_tokens": 8, "depth": 4, "topk": 2, "width": 2}, None, r"spec.tree.width: unknown key"),
])
def test_bad_shapes_name_the_key(value, modules, message):
    with pytest.raises(ValueError, match=message) as e:
        build_tree_shape(value, modules)
    assert "\n" not in str(e.value)


def test_bad_settings_are_one_line(trained_tiny):
    with pytest.raises(ValueError, match=r"^spec.tree=\[0\]: every width must be >= 1"):
        EngineConfig(tree=[0])
    with pytest.raises(ValueError, match=r"spec.tree is 5 deep but the model has 4 MTP modules"):
        build_speculator("mtp8", trained_tiny, None, tree=[2] + [1] * 4)
    with pytest.raises(ValueError, match=r"spec.num_speculative_tokens=4 with a spec.tree 3 deep"):
        build_speculator("mtp1", trained_tiny, 4, tree=[2, 1, 1])
    with pytest.raises(ValueError, match=r"spec.tree with spec.num_speculative_tokens=auto: give a leaf"):
        LLM(model=trained_tiny, spec="mtp8", num_speculative_tokens="auto", tree=[2, 1])
    dynamic = {"num_draft_tokens": 4, "depth": 2, "topk": 2}
    with pytest.raises(ValueError, match=r"^spec.tree as a dynamic tree \(num_draft_tokens\) with engine"):
        LLM(model=trained_tiny, spec="mtp8", compile=True, tree=dynamic)
    llm = LLM(model=trained_tiny, spec="mtp8", tree=[2, 1])
    outs = llm.generate([[5, 8], [5, 9], [5, 7]], [SamplingParams(max_tokens=4, temperature=0.7, seed=1),
                                                   SamplingParams(max_tokens=4, ignore_eos=True),
                                                   SamplingParams(max_tokens=4, allowed_token_ids=[5, 6])])
    assert outs[0].error is None and len(outs[0].output_token_ids) == 4      # tests/test_tree_sampling.py
    assert outs[1].error is None and len(outs[1].output_token_ids) == 4
    assert outs[2].error.startswith("spec.tree with structured_outputs, allowed_token_ids or bad_words")


def test_a_chain_tree_is_the_chain_speculator(trained_tiny):
    """[1] * k is the chain speculator itself (today's code path, today's tokens)."""
    s1, s8 = (build_speculator(m, trained_tiny, None, tree=[1, 1, 1]) for m in ("mtp1", "mtp8"))
    assert type(s1) is SingleModuleMTPSpeculator and s1.num_speculative_tokens == 3
    assert type(s8) is MultiModuleMTPSpeculator and s8.num_speculative_tokens == 3
    assert isinstance(build_speculator("mtp8", trained_tiny, None, tree=[2, 1]), TreeSpeculator)


# ---- tree algebra -------------------------------------------------------------------------------
def test_ancestor_mask_and_greedy_walk():
    s = build_tree_shape([2, 2, 1])
    parents, depths, _ = (x[None] for x in s.tensors())
    mask = ancestor_mask(parents, s.depth)[0]
    assert mask[9].nonzero()[:, 0].tolist() == [0, 2, 5, 9]         # node 9: path (1, 0, 0)
    assert mask[4].nonzero()[:, 0].tolist() == [0, 1, 4]
    tokens = torch.tensor([[0, 5, 6, 7, 8, 7, 8, 9, 9, 9, 9]])
    target = torch.zeros(1, 11, dtype=torch.long)
    target[0, 0], target[0, 2], target[0, 5], target[0, 9] = 6, 7, 9, 3  # 6 (node 2), 7 (5), 9 (9)
    valid = torch.ones(1, 11, dtype=torch.bool)
    accepted, path = greedy_walk(tokens, parents, depths, valid, target, s.depth)
    assert accepted.tolist() == [3] and path.tolist() == [[0, 2, 5, 9]]
    valid[0, 9] = False                                                # padding never matches
    accepted, path = greedy_walk(tokens, parents, depths, valid, target, s.depth)
    assert accepted.tolist() == [2] and path.tolist() == [[0, 2, 5, 5]]
    target[0, 0] = 1                                                   # no child matches
    assert greedy_walk(tokens, parents, depths, valid, target, s.depth)[0].tolist() == [0]


# ---- the tree from scratch ----------------------------------------------------------------------
def _logits_from_scratch(model, seq, hid, path, multi):
    """The draft logits of a node whose path holds tokens `path` after the known tokens seq
    (hid [1, n, hidden]: the target's hidden states at positions 0 .. n - 1, from scratch),
    computed without a cache: multi-module MTP's module len(path) + 1 at position n - 1
    (mtp_chain; the hidden states after n - 1 are never read there), single-module MTP's module
    applied len(path) + 1 times."""
    n = len(seq) - 1
    if multi:
        full = torch.tensor([seq + path])
        h = torch.cat([hid, hid.new_zeros(1, full.shape[1] - n, hid.shape[-1])], 1)
        chain = model.mtp_chain(full, h, len(path) + 1)
        return model.draft_logits(len(path), chain[len(path)][0, n - 1])
    emb = model.model.embed_tokens(torch.tensor([seq[1:] + path]))
    a = model.mtp[0](emb[:, :n], hid, torch.arange(n)[None])
    for i in range(len(path)):
        hid = torch.cat([hid, a[:, -1:]], 1)
        a = model.mtp[0](emb[:, : n + i + 1], hid, torch.arange(n + i + 1)[None])
    return model.draft_logits(0, a[0, -1])


def tree_from_scratch(model, seq, shape, multi) -> list[int]:
    """The N node tokens (breadth first) of the tree drafted from scratch after seq."""
    hid = model.model(torch.tensor([seq]))[:, : len(seq) - 1]
    paths = {0: []}
    tokens = [None] * (shape.num_nodes + 1)
    for level in range(1, shape.depth + 1):
        for p in [i for i, d in enumerate(shape.depths) if d == level - 1]:
            kids = [c for c in range(1, shape.num_nodes + 1) if shape.parents[c] == p]
            if not kids:
                continue
            top = _logits_from_scratch(model, seq, hid, paths[p], multi).topk(shape.widths[level - 1]).indices
            for c in kids:
                tokens[c] = int(top[shape.ranks[c]])
                paths[c] = paths[p] + [tokens[c]]
    return tokens[1:]


def install_tree_check(llm, model, shape, multi) -> list:
    """Every tree proposed is compared with the tree from scratch over the request's tokens after
    the step (tests.helpers.install_proposal_check)."""
    return install_proposal_check(
        llm, lambda seq, got: tree_from_scratch(model, seq, shape, multi)[: len(got)])


# ---- the engine ---------------------------------------------------------------------------------
PROMPTS = [[5, 8, 11, 14], [20], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [40, 42, 44],
           [9, 9, 9, 9, 9, 9, 9], [61, 2, 7, 33, 12], [30, 31], [50, 53, 56, 59, 62, 5, 8]]


@pytest.mark.parametrize("spec,tree,check_drafts", [
    (TREES[1][0], TREES[1][1], True), (TREES[0][0], TREES[0][1], False),
    pytest.param(*TREES[0], True, marks=pytest.mark.slow),
    pytest.param(*TREES[2], True, marks=pytest.mark.slow)],
    ids=["mtp8-2,2,1", "mtp1-2,2,1-tokens", "mtp1-2,2,1", "mtp8-paths"])
def test_tree_equals_plain_and_drafts_exact(trained_tiny, spec, tree, check_drafts):
    """Tokens and logit gaps equal plain decoding; with check_drafts every tree equals the tree
    from scratch (the from-scratch mtp1 trees are the slow part)."""
    model = trained_tiny
    prompts = PROMPTS[:5]
    params = [_params(16 - i) for i in range(len(prompts))]
    llm = make_llm(model, spec, tree=tree, max_num_seqs=4)
    shape = llm.speculator.shape
    checked = install_tree_check(llm, model, shape, spec == "mtp8") if check_drafts else None
    outs, _ = run_checked(llm, model, prompts, params)
    if check_drafts:
        bad = [c[1:] for c in checked if not c[0]]
        assert not bad, bad[:2]
        assert len(checked) > 15
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    rounds = sum(o.spec.num_drafts for o in outs)
    assert 0 < accepted < shape.depth * rounds
    # metrics.json's "tree": accepted nodes per depth and sibling rank, counted per round; some
    # accepted paths take a child that is not the draft's first choice
    stats = llm.engine.runner.tree_stats
    per_depth = [sum(o.spec.accepted_per_position[d] for o in outs) for d in range(shape.depth)]
    assert [sum(row) for row in stats.rank_counts] + [0] * (shape.depth - len(stats.rank_counts)) == per_depth
    assert sum(sum(row[1:]) for row in stats.rank_counts) > 0
    assert stats.rounds == rounds and stats.nodes == sum(o.spec.num_draft_tokens for o in outs)


@pytest.mark.slow
def test_tree_beats_its_chain_on_acceptance(trained_tiny):
    """The same drafter, the same depth: the tree's acceptance length exceeds the chain's."""
    params = [_params(24) for _ in PROMPTS]

    def acceptance_length(**kw):
        outs = LLM(model=trained_tiny, spec="mtp8", max_num_seqs=8, **kw).generate(PROMPTS, params)
        return 1 + sum(o.spec.num_accepted_tokens for o in outs) / sum(o.spec.num_drafts for o in outs)
    chain, tree = acceptance_length(num_speculative_tokens=3), acceptance_length(tree=[2, 2, 1])
    assert tree > chain + 0.2, (chain, tree)


@pytest.mark.parametrize("spec", ["mtp1", "mtp8"])
def test_tree_on_a_dense_target(spec):
    model = train_tiny(**LLAMA_FLAGS)
    params = [_params(16) for _ in PROMPTS]
    outs, _ = run_checked(make_llm(model, spec, tree=[2, 1, 1], max_num_seqs=4), model, PROMPTS, params)
    assert sum(o.spec.num_accepted_tokens for o in outs) > 0


LEAVES = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]     # a leaf tree: the chain's round drafts it (tree_leaves.py)


@pytest.mark.parametrize("spec,tree", [("mtp1", [2, 1, 1]), ("mtp8", [2, 2]), ("mtp8", LEAVES),
                                       pytest.param("mtp1", LEAVES, marks=pytest.mark.slow)])
def test_tree_with_prefix_caching_chunking_preemption(trained_tiny, spec, tree):
    """Both passes preempt (one block above the largest request's need), chunked prefill (8 tokens
    a step), prefix caching on: tokens and gaps equal plain decoding, every tree exact."""
    model = trained_tiny
    prompts = shared_prefix_prompts()
    params = [_params(t) for t in (9, 14, 5, 12, 10, 3, 13, 8)]
    N = build_tree_shape(tree).num_nodes
    nb = max(blocks_needed(len(p), sp.max_tokens, N, 4) for p, sp in zip(prompts, params)) + 1
    llm = make_llm(model, spec, tree=tree, max_num_seqs=4, block_size=4, num_blocks=nb,
                   enable_prefix_caching=True, max_num_batched_tokens=8)
    checked = install_tree_check(llm, model, llm.speculator.shape, spec == "mtp8")
    run_checked(llm, model, prompts, params)
    preemptions = llm.engine.num_preemptions
    _, reqs = run_checked(llm, model, prompts, params)
    bad = [c[1:] for c in checked if not c[0]]
    assert not bad, bad[:2]
    assert preemptions > 0 and llm.engine.num_preemptions > preemptions
    assert sum(r.num_cached_tokens for r in reqs.values()) > 0


@pytest.mark.parametrize("tree", [[2, 2, 1], {"num_draft_tokens": 6, "depth": 3, "topk": 2}, LEAVES],
                         ids=["static", "dynamic", "leaves"])
def test_tree_stop_inside_accepted_path_and_abort(trained_tiny, tree):
    """A stop token inside an accepted path ends the request there; an aborted request frees
    everything and the others still equal plain decoding (a static, a dynamic and a leaf tree)."""
    model = trained_tiny
    ref = reference(model, PROMPTS, [_params(20) for _ in PROMPTS])
    stop = ref[0][5]
    params = [_params(20, stop) for _ in PROMPTS]
    llm = make_llm(model, "mtp8", tree=tree, max_num_seqs=4)
    run_checked(llm, model, PROMPTS, params)
    victim, done = 2, []

    def on_step(engine):
        r = next((r for r in engine.scheduler.running if r.index == victim), None)
        if r is not None and not done and r.output_token_ids:
            engine.abort(r)
            done.append(True)
    params = [_params(20) for _ in PROMPTS]
    outs = llm.generate(PROMPTS, params, on_step=on_step)
    assert_clean(llm)
    assert done and outs[victim].finish_reason == "abort"
    got = outs[victim].output_token_ids
    assert got == ref[victim][: len(got)] and len(got) < 20
    assert [o.output_token_ids for i, o in enumerate(outs) if i != victim] == \
        [t for i, t in enumerate(ref) if i != victim]


SPEC_TREES = st.sampled_from([("mtp8", [2, 2, 1]), ("mtp1", [2, 1, 1]), ("mtp8", [[0], [1], [0, 0], [1, 0]]),
                              ("mtp1", [3]), ("mtp8", {"num_draft_tokens": 5, "depth": 3, "topk": 2}),
                              ("mtp1", {"num_draft_tokens": 4, "depth": 2, "topk": 2}),
                              ("mtp8", LEAVES), ("mtp1", [[0], [1], [2], [0, 0], [0, 0, 0], [0, 0, 1]])])


@settings(max_examples=int(os.environ.get("MTPX_TREE_EXAMPLES", 6)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(w=workloads(), spec=SPEC_TREES, B=st.sampled_from([4, 8, 16]), preempt_prefix=st.booleans())
def test_random_workloads_with_trees_equal_plain_greedy(trained_tiny, w, spec, B, preempt_prefix):
    """tests/test_engine.py's random workloads (shared prefixes, stops, 1-24 tokens) with trees:
    prefix caching off and on (twice: the second pass hits), one batch slot, a tiny pool."""
    model = trained_tiny
    prompts, max_tokens, stop = w
    params = [_params(t, stop) for t in max_tokens]
    name, tree = spec
    shape = build_tree_shape(tree)
    la = 1 if name == "mtp1" or shape.depth < 2 else shape.depth
    ref = reference(model, prompts, params)
    need = [blocks_needed(len(p), t, shape.num_nodes, B) for p, t in zip(prompts, max_tokens)]

    def check(llm):
        _, outs, reqs = generate(llm, prompts, params)
        assert_matches_reference(model, outs, prompts, params)
        return reqs

    kw = dict(tree=tree, block_size=B)
    check(make_llm(model, name, max_num_seqs=16, **kw))
    llm = make_llm(model, name, max_num_seqs=16, enable_prefix_caching=True, num_blocks=2 * sum(need) + 1,
                   **kw)
    check(llm)
    reqs = check(llm)
    for i, p in enumerate(prompts):
        assert reqs[i].num_cached_tokens >= _min_hit_blocks(len(p), len(ref[i]), la, B) * B
    check(make_llm(model, name, max_num_seqs=1, enable_prefix_caching=True, **kw))
    llm = make_llm(model, name, max_num_seqs=16, num_blocks=max(need) + 1,
                   enable_prefix_caching=preempt_prefix, **kw)
    check(llm)
    event(f"preempted: {llm.engine.num_preemptions > 0}")


def test_gated_deltanet_over_a_tree_equals_each_path_as_a_chain():
    """Invariant 3 on trees: a Gated DeltaNet layer over tree nodes (parent-indexed conv and delta
    rule) gives, at every node, the output, conv window and state of the plain layer run over the
    node's root-to-node path as a sequence, from the same stored state (float64, within 1e-12)."""
    from mtpx.attention.meta import ForwardMeta
    from mtpx.cache.state import RecurrentState
    from mtpx.models.deltanet import GatedDeltaNet
    from mtpx.models.tree_forward import gdn_tree
    from tests.helpers import tiny_config

    torch.manual_seed(0)
    layer = GatedDeltaNet(tiny_config()).double()
    spec = layer.cache_spec()
    shape = build_tree_shape([2, 2, 1])
    parents, depths, _ = shape.tensors()
    T = shape.num_nodes + 1
    x = torch.randn(1, T, 64, dtype=torch.float64)
    state = RecurrentState.allocate(2, spec.conv_dim, spec.kernel, spec.heads, spec.key_dim,
                                    spec.value_dim, torch.float64)
    state.conv[0].normal_()                           # a stored state before the root
    state.ssm[0].normal_()
    levels = [(depths.tolist().index(d), T - depths.tolist()[::-1].index(d)) for d in range(shape.depth + 1)]
    rows = torch.tensor([0])
    meta = ForwardMeta(depths[None], torch.ones(1, T, dtype=torch.bool), rows, None)
    out, kept = gdn_tree(layer, x, state, meta, parents[None], levels)
    for node in range(T):
        path, p = [], node
        while p >= 0:
            path.insert(0, p)
            p = shape.parents[p]
        chain = RecurrentState.allocate(2, spec.conv_dim, spec.kernel, spec.heads, spec.key_dim,
                                        spec.value_dim, torch.float64)
        chain.conv[0], chain.ssm[0] = state.conv[0], state.ssm[0]
        L = len(path)
        cmeta = ForwardMeta(torch.arange(L)[None], torch.ones(1, L, dtype=torch.bool), rows, L)
        want = layer(x[:, path], chain, cmeta)
        torch.testing.assert_close(out[0, node], want[0, -1], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kept.ssm[0, node], chain.ssm[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kept.conv_after(torch.tensor([0]), torch.tensor([node]))[0], chain.conv[0],
                                   rtol=1e-12, atol=1e-12)
