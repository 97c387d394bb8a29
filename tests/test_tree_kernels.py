"""The C kernels of tree steps against their torch references, in float64: the tree-masked paged
attention (mtpx.attention.tree_kernel; reference: TreeAttention's gather and masked SDPA) on random
trees, layouts, grouped heads, padding and drafting's masks (a stale gap between the committed
KV and the tree, a subset of the nodes as queries), and the parent-indexed gated delta rule
(mtpx.models.gdn_tree_kernel; reference: tree_forward.tree_delta_rule); and float32 tree engines,
which run both, against plain greedy decoding."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mtpx import LLM
from mtpx.attention import tree_kernel
from mtpx.attention.kv_cache import KVCache
from mtpx.attention.tree_attention import node_meta
from mtpx.models import gdn_tree_kernel
from mtpx.models.tree_forward import tree_delta_rule
from mtpx.spec_decode.tree import ancestor_mask, build_tree_shape
from tests.helpers import _params, spy

pytestmark = pytest.mark.skipif(not (tree_kernel.available() and gdn_tree_kernel.available()),
                                reason="no C compiler: the kernels are not built")
TOL = 2e-5          # float32 kernel against the float64 reference, inputs of unit scale


def random_parents(g: torch.Generator, T: int) -> torch.Tensor:
    """[T] int64: node 0 the root (-1), node t's parent one of nodes 0 .. t - 1."""
    return torch.tensor([-1] + [int(torch.randint(0, t, (1,), generator=g)) for t in range(1, T)])


def attention_case(seed, B, T, heads, D, S, max_len, pad, gap, subset):
    g = torch.Generator().manual_seed(seed)
    H, Hkv = heads
    NT = T + 2 if subset else T                      # tree columns; queries: a subset of the nodes
    nb = -(-(max_len + gap + 2 + NT) // S)
    NB = B * nb + 3
    kc, vc = torch.randn(NB, S, Hkv, D, generator=g), torch.randn(NB, S, Hkv, D, generator=g)
    table = torch.randperm(NB, generator=g)[: B * nb].view(B, nb)
    base = torch.randint(gap + 1, max_len + gap + 2, (B,), generator=g)
    prefix_end = base - torch.randint(0, gap + 1, (B,), generator=g)
    parents = random_parents(g, NT)
    anc = ancestor_mask(parents[None], NT)[0]                                  # [NT, NT]
    nodes = torch.arange(NT)[None].expand(B, NT)
    if subset:
        nodes = torch.sort(torch.randperm(NT, generator=g)[:T]).values[None].expand(B, T)
    valid = torch.ones(B, T, dtype=torch.bool)
    if pad:
        keep = torch.randint(1, T + 1, (B,), generator=g)
        valid = torch.arange(T)[None] < keep[:, None]
    meta = node_meta(table, S, torch.arange(B), base, nodes, valid, prefix_end, anc[nodes], "torch")
    q = torch.randn(B, T, H, D, generator=g)
    k, v = torch.randn(B, T, Hkv, D, generator=g), torch.randn(B, T, Hkv, D, generator=g)
    return q, k, v, KVCache(kc, vc), meta


def outputs(q, k, v, cache, meta):
    """(float64 reference, kernel) outputs of TreeAttention.forward on copies of the cache."""
    ref_cache = KVCache(cache.k.double(), cache.v.double())
    tree_kernel.use_kernel = False
    try:
        ref = meta.attn_backend.forward(q.double(), k.double(), v.double(), ref_cache, meta)
    finally:
        tree_kernel.use_kernel = True
    c = KVCache(cache.k.clone(), cache.v.clone())
    assert tree_kernel.supports(q, c.k)
    return ref, meta.attn_backend.forward(q, k, v, c, meta), ref_cache, c


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), B=st.integers(1, 4), T=st.integers(1, 14),
       heads=st.sampled_from([(1, 1), (4, 2), (8, 2), (6, 3)]), D=st.sampled_from([8, 20, 32, 64]),
       S=st.sampled_from([1, 4, 16]), max_len=st.integers(0, 40), pad=st.booleans(),
       gap=st.integers(0, 3), subset=st.booleans())
def test_tree_attention_kernel_equals_the_masked_sdpa(seed, B, T, heads, D, S, max_len, pad, gap, subset):
    q, k, v, cache, meta = attention_case(seed, B, T, heads, D, S, max_len, pad, gap, subset)
    ref, out, ref_cache, c = outputs(q, k, v, cache, meta)
    valid = meta.valid
    assert torch.allclose(out[valid].double(), ref[valid], atol=TOL, rtol=0)
    assert torch.equal(c.k, ref_cache.k.float()) and torch.equal(c.v, ref_cache.v.float())   # same writes


def test_tree_attention_kernel_masks_exactly():
    """A key outside the mask has weight exactly 0: a huge value there changes nothing."""
    q, k, v, cache, meta = attention_case(3, 2, 6, (4, 2), 32, 4, 20, False, 2, False)
    out = meta.attn_backend.forward(q, k, v, KVCache(cache.k.clone(), cache.v.clone()), meta)
    c = KVCache(cache.k.clone(), cache.v.clone())
    pe, base = meta.attn_backend.prefix_end, meta.attn_backend.base
    for b in range(2):          # the stale gap between the committed KV and the tree
        for p in range(int(pe[b]), int(base[b])):
            c.v.view(-1, *c.v.shape[2:])[meta.block_table[b, p // 4] * 4 + p % 4] = 1e6
    assert torch.equal(meta.attn_backend.forward(q, k, v, c, meta), out)


SHAPES = [[2], [2, 1, 1], [3, 2, 1], [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]]


@pytest.mark.parametrize("tree", SHAPES)
@pytest.mark.parametrize("heads", [(2, 32, 32), (3, 16, 24)])
@torch.no_grad()
def test_gdn_tree_kernel_equals_the_level_loop(tree, heads):
    shape = build_tree_shape(tree)
    parents, depths, _ = shape.tensors()
    T = parents.numel()
    levels = [(shape.depths.index(d), T - shape.depths[::-1].index(d)) for d in range(shape.depth + 1)]
    H, dk, dv = heads
    g = torch.Generator().manual_seed(T)
    B = 3
    q, k = torch.randn(B, T, H, dk, generator=g), torch.randn(B, T, H, dk, generator=g)
    v = torch.randn(B, T, H, dv, generator=g)
    gate = -torch.rand(B, T, H, generator=g)
    beta = torch.rand(B, T, H, generator=g)
    gate[2, T - 1], beta[2, T - 1] = 0, 0                       # a padding node keeps its parent's state
    S0 = torch.randn(B, H, dk, dv, generator=g)
    o_ref, ssm_ref = tree_delta_rule(*(x.double() for x in (q, k, v, gate, beta, S0)), parents, levels)
    assert gdn_tree_kernel.runs(q, S0)
    o, ssm = gdn_tree_kernel.tree(q, k, v, gate, beta, S0, parents[None].expand(B, T))
    assert torch.allclose(o.double(), o_ref, atol=TOL, rtol=0)
    assert torch.allclose(ssm.double(), ssm_ref, atol=TOL, rtol=0)
    assert torch.equal(ssm[2, T - 1], ssm[2, parents[T - 1]] if parents[T - 1] >= 0 else S0[2])


def test_float32_tree_engines_run_the_kernels_and_equal_plain(trained_tiny, monkeypatch):
    """The float32 tiny hybrid: mtp1 and mtp8 tree engines (the C kernels in every tree forward)
    give plain decoding's greedy tokens."""
    model = copy.deepcopy(trained_tiny).float()
    prompts = [[5, 8, 11, 14], [20], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [40, 42, 44], [61, 2, 7]]
    params = [_params(14) for _ in prompts]
    plain = [o.output_token_ids for o in LLM(model=model, max_num_seqs=4).generate(prompts, params)]
    attention = spy(monkeypatch, tree_kernel, "_tree_attention")
    recurrence = spy(monkeypatch, gdn_tree_kernel, "_gdn_tree")
    for spec, tree in [("mtp1", [2, 1, 1]), ("mtp8", [2, 2, 1])]:
        outs = LLM(model=model, spec=spec, tree=tree, max_num_seqs=4).generate(prompts, params)
        assert [o.output_token_ids for o in outs] == plain, spec
        assert sum(o.spec.num_accepted_tokens for o in outs) > 0
    assert len(attention) > 0 and len(recurrence) > 0
