"""The automatic choice between chain and tree under engine.compile (mtpx/engine/tree_choice.py,
mtpx/engine/compiled_tree.py): chain steps in automatic k's compiled graphs, tree steps in the
tree's verification graph and its leaf round (the chain's draft graph with the leaves); switching
steps propose eager. Traced with the "eager" backend (Dynamo only), as tests/test_tree_compiled.py.
"""
from __future__ import annotations

import torch

from tests.helpers import _params, make_llm, run_checked
from tests.test_tree import PROMPTS
from tests.test_tree_choice import MTP8_LEAVES, _check_kv, _costs


def test_compiled_choice_switching_equals_plain_without_recompiles(trained_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path / "cache"))
    model = trained_tiny
    llm = make_llm(model, "mtp8", "auto", tree=MTP8_LEAVES, max_num_seqs=3, enable_prefix_caching=True,
                   cost_model_file=_costs(tmp_path / "costs.json"), compile=True, compile_backend="eager",
                   compile_depths=[0, 4], check_invariants=False)
    stats = llm.engine.compile_stats()
    print([g["graph"] for g in stats["graphs"]])
    policy, runner = llm.engine.draft_length, llm.engine.runner
    policy.forced_tree = lambda step: step % 6 in (1, 2, 4)
    policy.forced, policy.forced_depth = policy.max_k, policy.max_k
    forms = []

    def on_step(engine):
        forms.append(policy._forms)
        policy.forced = (0, 2, policy.max_k)[len(forms) % 3]
        _check_kv(engine, model)
    params = [_params(14 - i) for i in range(3)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        run_checked(llm, model, PROMPTS[:3], params, on_step=on_step)
    assert {(False, True), (True, False), (True, True), (False, False)} <= set(forms)
    assert llm.engine.compile_stats()["num_graphs"] == stats["num_graphs"]
    assert runner.tree_stats.rounds > 5
