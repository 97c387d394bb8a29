"""engine.compile with tree drafting (mtpx/engine/compiled_tree.py): the tree verification forward
as one compiled graph per engine (a leaf tree's draft round a second), token-identical to plain
decoding.

Default suite: the tree ops' fake (tracing) implementations agree with the kernels (opcheck); a
float64 tree engine traced with the "eager" backend (Dynamo only) builds one verification graph
for batches of 2, 3 and 1 and gives plain decoding's tokens; a leaf-tree engine builds two (the
verification and the chain's draft round with the leaves).
Slow (`python -m pytest -q -p no:randomly -m slow tests/test_tree_compiled.py`): Inductor on the
float32 tiny hybrid (the C kernels as torch ops in the graph), mtp1 and mtp8 trees equal to plain
decoding, the graphs saved and loaded by a second engine (Inductor builds a second variant for
batch 1: a guard on batch >= 2 not found yet).
"""
from __future__ import annotations

import copy

import pytest
import torch

from mtpx import LLM
from mtpx.attention import tree_kernel
from mtpx.models import gdn_tree_kernel
from mtpx.spec_decode.tree import ancestor_mask
from tests.helpers import _params

PROMPTS = [[5, 8, 11, 14], [20], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [40, 42, 44], [61, 2, 7]]
kernels = pytest.mark.skipif(not (tree_kernel.available() and gdn_tree_kernel.available()),
                             reason="no C compiler: the kernels are not built")


def _generate(llm, n=14):
    return [o.output_token_ids for o in llm.generate(PROMPTS, [_params(n) for _ in PROMPTS])]


@kernels
def test_tree_ops_fake_agrees_with_the_kernels():
    """torch.library.opcheck: schema, fake tensor shapes and strides, and tracing of
    mtpx::paged_tree_attention and mtpx::gdn_tree against their C kernels."""
    g = torch.Generator().manual_seed(0)
    B, T, H, Hkv, D, S = 2, 4, 4, 2, 16, 4
    parents = torch.tensor([-1, 0, 0, 1])
    anc = ancestor_mask(parents[None], 2).expand(B, T, T).contiguous()
    kc, vc = torch.randn(6, S, Hkv, D, generator=g), torch.randn(6, S, Hkv, D, generator=g)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]])
    base = torch.tensor([5, 3])
    valid = torch.tensor([[True] * 4, [True, True, True, False]])
    q = torch.randn(B, T, H, D, generator=g)
    torch.library.opcheck(torch.ops.mtpx.paged_tree_attention, (q, kc, vc, table, anc, base, base, valid))
    dk = dv = 8
    args = (torch.randn(B, T, H, dk, generator=g), torch.randn(B, T, H, dk, generator=g),
            torch.randn(B, T, H, dv, generator=g), -torch.rand(B, T, H, generator=g),
            torch.rand(B, T, H, generator=g), torch.randn(B, H, dk, dv, generator=g),
            parents[None].expand(B, T).contiguous())
    torch.library.opcheck(torch.ops.mtpx.gdn_tree, args)


def test_compiled_tree_one_graph_equals_plain(trained_tiny, monkeypatch):
    """A float64 mtp8 tree engine under Dynamo (backend "eager"): one verification graph serves
    the warm-up's batches of 2, 3 and 1 and every later step (error_on_recompile), tokens equal
    plain decoding's."""
    plain = _generate(LLM(model=trained_tiny, max_num_seqs=4))
    llm = LLM(model=trained_tiny, spec="mtp8", tree=[2, 1], max_num_seqs=4, compile=True,
              compile_backend="eager")
    stats = llm.engine.compile_stats()
    assert [g["graph"] for g in stats["graphs"]] == ["tree verify (5-node window)"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        outs = llm.generate(PROMPTS, [_params(14) for _ in PROMPTS])
    assert [o.output_token_ids for o in outs] == plain
    assert sum(o.spec.num_accepted_tokens for o in outs) > 0
    assert llm.engine.compile_stats()["num_graphs"] == 1


@pytest.mark.parametrize("spec", ["mtp8", pytest.param("mtp1", marks=pytest.mark.slow)])
def test_compiled_leaf_tree_two_graphs_equal_plain(trained_tiny, spec):
    """A float64 leaf-tree engine (the chain and its leaves, mtpx/spec_decode/tree_leaves.py) under
    Dynamo: two graphs (the tree verification, the chain's draft round with the leaves) for the
    warm-up's batches and every later step (error_on_recompile); tokens equal
    plain decoding's, and accepted paths end in a leaf."""
    plain = _generate(LLM(model=trained_tiny, max_num_seqs=4))
    llm = LLM(model=trained_tiny, spec=spec, tree=[[0], [1], [0, 0], [0, 1], [0, 0, 0]], max_num_seqs=4,
              compile=True, compile_backend="eager")
    graphs = [g["graph"] for g in llm.engine.compile_stats()["graphs"]]
    assert graphs == ["tree verify (6-node window)", "leaf-tree draft loop (3 modules, 4 columns)"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        outs = llm.generate(PROMPTS, [_params(14) for _ in PROMPTS])
    assert [o.output_token_ids for o in outs] == plain
    assert llm.engine.compile_stats()["num_graphs"] == 2
    assert sum(sum(row[1:]) for row in llm.engine.runner.tree_stats.rank_counts) > 0


@kernels
@pytest.mark.slow
@pytest.mark.parametrize("spec, tree", [("mtp1", [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
                                        ("mtp8", [2, 2, 1])])
def test_inductor_tree_engine_equals_plain_and_reloads(trained_tiny, spec, tree, tmp_path, monkeypatch):
    """Inductor on the float32 tiny hybrid: the tree ops run inside the graph, tokens equal plain
    decoding's; a second engine of the same settings loads the saved graph instead of compiling."""
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path))
    model = copy.deepcopy(trained_tiny).float()
    plain = _generate(LLM(model=model, max_num_seqs=4))
    for source in ("compiled", "loaded"):
        llm = LLM(model=model, spec=spec, tree=tree, max_num_seqs=4, compile=True)
        stats = llm.engine.compile_stats()
        # Inductor guards batch >= 2 somewhere in the graph: batch 1 is a second saved variant
        # (Dynamo alone builds one graph: test_compiled_tree_one_graph_equals_plain)
        assert 1 <= len(stats["graphs"]) <= 2
        built = {(g["graph"].split(" (")[0], g["source"]) for g in stats["graphs"]}
        assert built == {("tree verify", source)}
        with torch._dynamo.config.patch(error_on_recompile=True):
            assert _generate(llm) == plain
