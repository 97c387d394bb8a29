"""Drafting under the grammar mask in the compiled step (mtpx/structured/draft_op.py): a batch with
constrained requests drafts through its own compiled graph, with the grammar's host work in the
`mtpx::grammar_draft` operator, and decodes exactly as eager plain decoding under the same
constraints. The default test traces with torch.compile's "eager" backend (Dynamo's graphs and
guards without code generation); the slow one compiles with Inductor
(`pytest -m slow tests/test_structured_compiled.py`).
"""
import pytest
import torch

from mtpx import LLM
from mtpx.structured import draft_op
from mtpx.structured.drafts import GrammarDraftSampler
from tests.test_structured_output import tiny_plain  # noqa: F401 (fixture)


def _run(llm, reqs):
    return llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)


def _check(trained_tiny, tiny_plain, backend, spec, k, monkeypatch):  # noqa: F811
    """Tokens equal eager plain decoding's; every masked draft ran inside the operator."""
    tok, reqs, plain = tiny_plain
    inside, outside = [], []
    call = GrammarDraftSampler.__call__

    def recording(self, logits, i):
        (inside if draft_op._ACTIVE[0] is self else outside).append(i)
        return call(self, logits, i)
    monkeypatch.setattr(GrammarDraftSampler, "__call__", recording)
    llm = LLM(model=trained_tiny, tokenizer=tok, spec=spec, num_speculative_tokens=k, max_num_seqs=8,
              compile=True, compile_backend=backend)
    outs = _run(llm, reqs)
    for a, b in zip(outs, plain):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    names = [r["graph"] for r in llm.engine.compiled.progress.records]
    assert any("under the grammar mask" in n for n in names), names
    # decode rounds drafted through the graph; only rounds after a prefill chunk run eager
    assert len(inside) > 20 and len(inside) > 3 * len(outside), (len(inside), len(outside))
    drafted = sum(o.spec.num_draft_tokens for o in outs)
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    assert 0 < accepted < drafted
    assert llm.engine.runner.grammars.draft_seconds > 0
    return llm, outs


@pytest.mark.parametrize("spec,k", [("mtp8", 4), pytest.param("mtp1", 3, marks=pytest.mark.slow)])
def test_compiled_masked_drafts_equal_plain_decoding(trained_tiny, tiny_plain, spec, k,  # noqa: F811
                                                     monkeypatch):
    torch._dynamo.reset()
    llm, outs = _check(trained_tiny, tiny_plain, "eager", spec, k, monkeypatch)
    # a second run reuses the graphs: no recompilation
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = _run(llm, tiny_plain[1])
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs]


def test_operator_outside_a_round_is_one_clear_error():
    with pytest.raises(RuntimeError, match="outside"):
        torch.ops.mtpx.grammar_draft(torch.zeros(2, 5), 0)


@pytest.mark.slow      # Inductor builds the masked draft graph (about a minute on one core)
def test_inductor_masked_drafts_equal_plain_decoding(trained_tiny, tiny_plain, monkeypatch):  # noqa: F811
    torch._dynamo.reset()
    _check(trained_tiny, tiny_plain, "inductor", "mtp8", 4, monkeypatch)
