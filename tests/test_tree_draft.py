"""mtp8 tree drafting at the chain's module cost (mtpx/spec_decode/tree_draft.py, `_grow_multi`):
each module runs once per decode round, over its catch-up positions and its depth's tree nodes
together, and after every step the module KV at every position the modules computed equals a
from-scratch run over the accepted tokens (tests/test_reprefill.py's standard), while every proposed
tree equals the tree drafted from scratch and the output equals plain decoding."""
from __future__ import annotations

from types import SimpleNamespace

from mtpx.engine import tree_step
from tests.helpers import _params, make_llm, run_checked
from tests.test_reprefill import assert_module_kv_exact
from tests.test_tree import PROMPTS, install_tree_check


def test_mtp8_tree_runs_each_module_once_and_keeps_module_kv_exact(trained_tiny, monkeypatch):
    model = trained_tiny
    llm = make_llm(model, "mtp8", tree=[2, 2, 1], max_num_seqs=4)
    spec = llm.speculator
    checked = install_tree_check(llm, model, spec.shape, True)
    calls, per_round = [0], []
    for m in model.mtp:
        forward = m.forward
        monkeypatch.setattr(m, "forward", lambda *a, _f=forward, **k: (calls.__setitem__(0, calls[0] + 1),
                                                                         _f(*a, **k))[1])
    propose = spec.propose

    def counted(cache, batch, plan=None):
        before = calls[0]
        out = propose(cache, batch, plan)
        if in_decode:
            per_round.append(calls[0] - before)
        return out
    monkeypatch.setattr(spec, "propose", counted)
    in_decode = []
    decode = tree_step.tree_decode

    def decode_flagged(runner, decodes, results, **kwargs):
        in_decode.append(True)
        try:
            return decode(runner, decodes, results, **kwargs)
        finally:
            in_decode.clear()
    monkeypatch.setattr(tree_step, "tree_decode", decode_flagged)
    monkeypatch.setattr("mtpx.engine.model_runner.tree_decode", decode_flagged)
    view = SimpleNamespace(num_draft_modules=spec.num_draft_modules, computed=spec.base.computed)

    def on_step(engine):                  # (the from-scratch reference needs more tokens than modules)
        running = [r for r in engine.scheduler.running if r.num_tokens > spec.shape.depth + 1]
        assert_module_kv_exact(SimpleNamespace(speculator=view, scheduler=SimpleNamespace(running=running),
                                               runner=engine.runner, cache=engine.cache), model, current=True)
    run_checked(llm, model, PROMPTS[:5], [_params(16 - i) for i in range(5)], on_step=on_step)
    assert len(per_round) >= 8 and set(per_round) == {spec.shape.depth}, per_round   # one forward per module
    bad = [c[1:] for c in checked if not c[0]]
    assert not bad and len(checked) > 15, bad[:2]
