"""The automatic choice between chain and tree under engine.compile (mtpx/engine/tree_choice.py,
mtpx/engine/compiled_tree.py, the warm-up's tree steps in mtpx/engine/warmup.py): chain steps run
automatic k's compiled graphs, tree steps the tree's verification graph and its leaf round (the
chain's draft graph with the leaves); a switching step's round runs eager. Traced with the "eager"
backend (Dynamo only), as tests/test_tree_compiled.py does.

Slow (`python -m pytest -q -p no:randomly -m slow tests/test_tree_choice_compiled.py`): Dynamo
traces six graphs, 20-30 s on CPU 0 of the 2-core EPYC shared with other work (automatic k's
compiled tests in tests/test_compiled.py are slow for the same reason).
"""
from __future__ import annotations

import pytest
import torch

from tests.helpers import make_llm
from tests.test_tree_choice import MTP8_LEAVES, _costs, run_switching

# automatic k's graphs with compile_depths [0, 4] (the tiny model's 4 modules), then the tree's two
GRAPHS = ["verify (5-token window)", "commit (5-token window)", "draft loop (4 modules, 5 columns)",
          "verify (1-token window)", "tree verify (7-node window)",
          "leaf-tree draft loop (4 modules, 5 columns)"]


@pytest.mark.slow
def test_compiled_choice_switching_equals_plain_without_recompiles(trained_tiny, tmp_path, monkeypatch):
    """mtp8 with automatic k and a 6-node leaf tree, compiled: the warm-up builds automatic k's 4
    graphs and the tree's 2, exactly; then, on test_tree_choice's forced schedule (tree steps 1, 2
    and 4 of every 6, chain k cycling 0, 2, 4), every switch runs with no recompile
    (error_on_recompile), no graph is added, tokens equal plain decoding's and the module KV equals
    a from-scratch run after every step."""
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path / "cache"))
    model = trained_tiny
    llm = make_llm(model, "mtp8", "auto", tree=MTP8_LEAVES, max_num_seqs=3, enable_prefix_caching=True,
                   cost_model_file=_costs(tmp_path / "costs.json"), compile=True, compile_backend="eager",
                   compile_depths=[0, 4])
    stats = llm.engine.compile_stats()
    assert [g["graph"] for g in stats["graphs"]] == GRAPHS and stats["num_graphs"] == 6
    policy, runner = llm.engine.draft_length, llm.engine.runner
    assert policy.forced_tree is None and policy.tree_steps == 0         # the warm-up's forgotten
    with torch._dynamo.config.patch(error_on_recompile=True):
        run_switching(llm, model)
    assert llm.engine.compile_stats()["num_graphs"] == 6
    assert runner.tree_stats.rounds > 5 and sum(sum(row[1:]) for row in runner.tree_stats.rank_counts) > 0
