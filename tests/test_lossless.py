"""Invariant 1: greedy speculative decoding emits exactly the tokens of plain greedy decoding.

Runs on a tiny hybrid model in float64 that was trained for a few steps on a synthetic corpus, so
drafts are accepted 35-65% of the time (both paths of verification are exercised)."""
import pytest

from mtpx import LLM, SamplingParams
from mtpx.evaluate import compare_outputs
from tests.helpers import LLAMA_FLAGS, train_tiny


PROMPTS = [[5, 8, 11, 14], [20], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [40, 42, 44],
           [9, 9, 9, 9, 9, 9, 9], [61, 2, 7, 33, 12], [30, 31], [50, 53, 56, 59, 62, 5, 8]]


def _run(model, spec, k, max_num_seqs=4, max_tokens=30):
    llm = LLM(model=model, spec=spec, num_speculative_tokens=k, max_num_seqs=max_num_seqs,
              record_logit_gaps=True)
    params = [SamplingParams(max_tokens=max_tokens - i, ignore_eos=True) for i in range(len(PROMPTS))]
    return llm.generate(PROMPTS, params)


@pytest.mark.parametrize("spec,k", [("mtp1", 1), ("mtp1", 3), ("mtp8", 4), ("mtp8", 2)])
def test_spec_equals_plain(trained_tiny, spec, k):
    plain = _run(trained_tiny, None, None)
    outs = _run(trained_tiny, spec, k)
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in plain]
    assert all(len(o.output_token_ids) == 30 - i for i, o in enumerate(outs))
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    drafted = sum(o.spec.num_draft_tokens for o in outs)
    assert 0.2 * drafted < accepted < 0.9 * drafted, "the test needs accepted and rejected drafts"
    # never propose more drafts than max_tokens can use: drafts <= output tokens - 1 per request
    for o in outs:
        assert o.spec.num_draft_tokens <= k * (len(o.output_token_ids) - 1)
        assert o.spec.num_accepted_tokens <= len(o.output_token_ids) - 1


@pytest.mark.parametrize("family", [dict(LLAMA_FLAGS, mtp_style="deepseek_v3"),
                                    dict(LLAMA_FLAGS, use_qk_norm=True)],
                         ids=["llama-deepseek_v3_heads", "qwen3"])
@pytest.mark.parametrize("spec,k", [("mtp1", 3), ("mtp8", 4)])
def test_spec_equals_plain_dense_families(family, spec, k):
    """The same invariant on a dense Llama target with DeepSeek-style MTP heads (pre-norm hidden
    passed on, own output heads) and on a Qwen3-style dense target."""
    model = train_tiny(**family)
    plain = _run(model, None, None)
    outs = _run(model, spec, k)
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in plain]
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    assert 0 < accepted < sum(o.spec.num_draft_tokens for o in outs)


def test_batch_composition_does_not_change_output(trained_tiny):
    one = _run(trained_tiny, "mtp8", 4, max_num_seqs=1)
    many = _run(trained_tiny, "mtp8", 4, max_num_seqs=8)
    assert [o.output_token_ids for o in one] == [o.output_token_ids for o in many]


def test_stop_token_inside_accepted_drafts(trained_tiny):
    """A stop token emitted mid-window ends the request there and tokens after it are dropped."""
    plain = _run(trained_tiny, None, None)[2].output_token_ids    # prompt 2 counts upward
    stop = plain[5]
    llm = LLM(model=trained_tiny, spec="mtp8", num_speculative_tokens=4)
    out = llm.generate([PROMPTS[2]], SamplingParams(max_tokens=30, stop_token_ids=[stop]))[0]
    first = plain.index(stop)
    assert out.output_token_ids == plain[: first + 1]
    assert out.finish_reason == "stop"
    assert out.spec.num_accepted_tokens <= first


def test_compare_outputs_classifies_near_ties(trained_tiny):
    plain = _run(trained_tiny, None, None)
    spec = _run(trained_tiny, "mtp1", 1)
    spec[0].output_token_ids = spec[0].output_token_ids[:3] + [0] + spec[0].output_token_ids[4:]
    mism, ties = compare_outputs(spec, plain, tie_tolerance=0.0)
    assert [(m["index"], m["position"]) for m in mism] == [(0, 3)] and ties == []
    mism, ties = compare_outputs(spec, plain, tie_tolerance=1e9)
    assert mism == [] and [(t["index"], t["position"]) for t in ties] == [(0, 3)]


@pytest.mark.parametrize("overrides", [
    dict(layer_types=["full_attention"] * 2, num_hidden_layers=2),                  # dense transformer
    dict(num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[0]),  # MoE
])
def test_dense_and_moe_targets_are_lossless(overrides):
    from tests.helpers import peaked_model, tiny_config
    model = peaked_model(tiny_config(**overrides), seed=3)
    plain = _run(model, None, None, max_tokens=16)
    for spec, k in (("mtp1", 2), ("mtp8", 3)):
        outs = _run(model, spec, k, max_tokens=16)
        assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in plain]
