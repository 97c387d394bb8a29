"""Lossy acceptance rules on trees (greedy): the neutral settings give the lossless tree's tokens,
and a relaxed rule changes the output, every emitted token being one the rule allows after its own
prefix (checked against the target's prompt log-probs of prompt + output)."""
import math

import pytest

from mtpx import LLM, SamplingParams

PROMPTS = [[5, 8, 11, 14], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [61, 2, 7, 33, 12]]
TREE = [2, 2, 1]
NEUTRAL = {"typical": dict(posterior_threshold=1.0, posterior_alpha=1e9),
           "relaxed": dict(relaxed_topk=1, relaxed_delta=0.0),
           "lenient": dict(lenient_lambda=1.0)}


def _run(model, **kw):
    llm = LLM(model=model, spec="mtp8", tree=TREE, max_num_seqs=4, **kw)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    return [o.output_token_ids for o in outs], sum(o.spec.num_accepted_tokens for o in outs)


def test_neutral_rules_on_a_tree_give_the_lossless_tokens(trained_tiny):
    lossless, accepted = _run(trained_tiny)
    assert accepted > 0
    for name, kw in NEUTRAL.items():
        assert _run(trained_tiny, acceptance=name, **kw)[0] == lossless, name


@pytest.mark.parametrize("topk, delta", [(3, 0.5), (8, 1.0)])
def test_relaxed_on_a_tree_changes_tokens_only_where_it_may(trained_tiny, topk, delta):
    """(The tiny target's lossless tree already accepts nearly its depth every round, so the
    accepted count can only stay or grow.)"""
    lossless, acc0 = _run(trained_tiny)
    out, acc = _run(trained_tiny, acceptance="relaxed", relaxed_topk=topk, relaxed_delta=delta)
    assert acc >= acc0 and out != lossless
    plain = LLM(model=trained_tiny, spec=None)
    changed = 0
    for prompt, toks in zip(PROMPTS, out):
        (ref,) = plain.generate([prompt + toks], SamplingParams(max_tokens=1, prompt_logprobs=topk))
        for i, t in enumerate(toks):
            entry = ref.prompt_logprobs[len(prompt) + i]
            best = max(lp.logprob for lp in entry.values())
            if entry[t].rank != 1:
                changed += 1
                assert entry[t].rank <= topk, (prompt, i)
                assert math.exp(entry[t].logprob) >= math.exp(best) - delta - 1e-9, (prompt, i)
    assert changed > 0


def test_trees_refuse_synthetic_and_sampled_lossy_requests(trained_tiny):
    with pytest.raises(ValueError, match=r"^spec.tree with spec.acceptance=synthetic: not supported"):
        LLM(model=trained_tiny, spec="mtp8", tree=TREE, acceptance="synthetic",
            synthetic_acceptance_rates=[0.5, 0.4, 0.3])
    llm = LLM(model=trained_tiny, spec="mtp8", tree=TREE, acceptance="relaxed", relaxed_topk=2)
    bad, good = llm.generate([[5, 8], [5, 9]], [SamplingParams(max_tokens=4, temperature=0.7, seed=1),
                                                 SamplingParams(max_tokens=4, ignore_eos=True)])
    assert bad.error.startswith("spec.tree with spec.acceptance=relaxed and temperature > 0")
    assert len(good.output_token_ids) == 4 and good.error is None
