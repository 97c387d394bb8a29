"""Sampling at temperature > 0 through the engine: the joint distribution of the first 3 emitted
tokens with speculative decoding equals the target's (computed exactly from the model), for mtp1
and mtp8, standard and block verification, greedy and probabilistic drafts, with and without
top-k/top-p; seeded requests are reproducible alone and in a batch; a stop token inside accepted
drafts ends the request there.

The distribution check: N seeded requests with the same prompt, total-variation distance between
the empirical joint of the first 3 tokens and the exact one below TV_MAX. At temperature 1.5 the
vocabulary-8 model's joint has an effective support of about 28 outcomes (exp of its entropy), so
with N = 4000 the sampling error is about 0.035; a verifier that accepts every draft exceeds the
threshold by far (test_distribution_check_has_power).
"""
from collections import Counter

import pytest
import torch

from mtpx import LLM, SamplingParams
from mtpx.spec_decode.sampler import probs_from_logits
from mtpx.spec_decode import verification
from tests.helpers import peaked_model, tiny_config

N = 4000
TV_MAX = 0.08
PROMPT = [5, 3, 1, 6]


def _model_v8():
    """Vocabulary 8: the joint of 3 tokens has at most 512 outcomes; at temperature 1.5 (on a
    20x-scaled lm_head) most of the mass sits on about 28 of them."""
    return peaked_model(tiny_config(vocab_size=8))


def exact_joint(model, params: SamplingParams, prompt=PROMPT, length=3) -> dict:
    """P(first `length` tokens) under the target with the request's processing, exactly."""
    def probs(seq):
        logits = model.lm_head(model.model(torch.tensor([seq]))[:, -1])
        return probs_from_logits(logits, torch.tensor([params.temperature], dtype=torch.float64),
                                 torch.tensor([params.top_k]), torch.tensor([params.top_p]),
                                 torch.tensor([params.min_p]))[0]
    out = {(): 1.0}
    with torch.no_grad():
        for _ in range(length):
            nxt = {}
            for s, ps in out.items():
                p = probs(list(prompt) + list(s))
                for t in (p > 0).nonzero()[:, 0].tolist():
                    nxt[s + (t,)] = ps * float(p[t])
            out = nxt
    return out


def empirical_joint(llm: LLM, params: SamplingParams, n=N) -> Counter:
    ps = [SamplingParams(max_tokens=3, temperature=params.temperature, top_k=params.top_k,
                         top_p=params.top_p, min_p=params.min_p, seed=i, ignore_eos=True)
          for i in range(n)]
    outs = llm.generate([PROMPT] * n, ps)
    return Counter(tuple(o.output_token_ids) for o in outs), outs


def tv(counts: Counter, exact: dict, n=N) -> float:
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(s, 0) / n - exact.get(s, 0.0)) for s in keys)


CASES = [  # (spec, k, verify, draft_sample_method, temperature, top_k, top_p)
    ("mtp8", 4, "standard", "greedy", 1.5, 0, 1.0),
    ("mtp8", 4, "block", "probabilistic", 1.5, 0, 1.0),
    ("mtp1", 3, "block", "greedy", 1.5, 3, 1.0),
    ("mtp1", 2, "standard", "probabilistic", 1.5, 0, 0.8),
]
SLOW_CASES = [(s, k, v, d, 1.5, tk, tp) for s, k in (("mtp1", 3), ("mtp8", 4))
              for v in ("standard", "block") for d in ("greedy", "probabilistic")
              for tk, tp in ((0, 1.0), (3, 0.9))]


def _check(spec, k, verify, draft, temperature, top_k, top_p, need_accepts=True):
    model = _model_v8()
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    llm = LLM(model=model, spec=spec, num_speculative_tokens=k, verify=verify,
              draft_sample_method=draft, max_num_seqs=512, max_num_batched_tokens=8192)
    counts, outs = empirical_joint(llm, params)
    d = tv(counts, exact_joint(model, params))
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    drafted = sum(o.spec.num_draft_tokens for o in outs)
    assert accepted < drafted, "the case needs rejected drafts"
    # (the random MTP modules' argmax drafts fall outside a top-k set now and then: some of the
    # slow combinations accept nothing and only check the rejection path)
    assert accepted > 0 or not need_accepts, "the case needs accepted drafts"
    assert d < TV_MAX, (d, accepted / drafted)
    print(f"TV {d:.4f}, acceptance {accepted / drafted:.3f}")
    return d


def test_plain_sampling_matches_exact_joint():
    model = _model_v8()
    params = SamplingParams(temperature=1.5, top_k=3)
    counts, _ = empirical_joint(LLM(model=model, max_num_seqs=512, max_num_batched_tokens=8192), params)
    assert tv(counts, exact_joint(model, params)) < TV_MAX


@pytest.mark.parametrize("case", CASES)
def test_spec_sampling_matches_target_distribution(case):
    _check(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES)
def test_spec_sampling_matches_target_distribution_all_combinations(case):
    _check(*case, need_accepts=False)


def test_distribution_check_has_power(monkeypatch):
    """Accepting every draft (a verifier that ignores p) is caught by the same threshold."""
    def accept_all(x, q, p, num_drafts, eta):
        b = torch.arange(x.shape[0])
        return num_drafts, p[b, num_drafts]
    monkeypatch.setitem(verification.VERIFIERS, "standard", accept_all)
    model = _model_v8()
    params = SamplingParams(temperature=1.5)
    llm = LLM(model=model, spec="mtp8", num_speculative_tokens=4, max_num_seqs=512,
              max_num_batched_tokens=8192)
    counts, _ = empirical_joint(llm, params)
    assert tv(counts, exact_joint(model, params)) > 2 * TV_MAX


@pytest.mark.parametrize("spec,k,verify,draft", [("mtp8", 4, "block", "probabilistic"),
                                                 ("mtp1", 3, "standard", "greedy")])
def test_seeded_request_same_alone_and_in_batch(trained_tiny, spec, k, verify, draft):
    llm = LLM(model=trained_tiny, spec=spec, num_speculative_tokens=k, verify=verify,
              draft_sample_method=draft, max_num_seqs=16)
    mine = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = llm.generate([PROMPT], [mine])[0].output_token_ids
    others = [SamplingParams(max_tokens=5 + i, temperature=0.7 + 0.1 * i, seed=i, ignore_eos=True)
              for i in range(15)]
    prompts = [[(3 * i + j) % 64 for j in range(1 + i % 7)] for i in range(15)]
    batch = llm.generate(prompts[:7] + [PROMPT] + prompts[7:], others[:7] + [mine] + others[7:])
    assert batch[7].output_token_ids == alone
    assert llm.generate([PROMPT], [mine])[0].output_token_ids == alone


def test_stop_token_inside_accepted_drafts_when_sampling(trained_tiny):
    """Temperature 0.3 with mtp8 x 8 accepts long runs; a stop token placed at the third token of
    an emission that accepted several drafts ends the request exactly there."""
    llm = LLM(model=trained_tiny, spec="mtp8", num_speculative_tokens=4)
    base = SamplingParams(max_tokens=30, temperature=0.3, seed=7, ignore_eos=True)
    full = llm.generate([PROMPT], [base])[0]
    steps = []
    llm2 = LLM(model=trained_tiny, spec="mtp8", num_speculative_tokens=4)
    llm2.generate([PROMPT], [base], on_step=lambda e: steps.append(
        len(e.scheduler.running[0].output_token_ids) if e.scheduler.running else None))
    sizes = [b - a for a, b in zip([0] + steps[:-1], steps) if a is not None and b is not None]
    start = None
    pos = 0
    for s in [steps[0]] + sizes:
        if s >= 3 and pos > 0:
            start = pos
            break
        pos += s
    assert start is not None, "the run needs an emission of >= 3 tokens"
    stop = full.output_token_ids[start + 2]
    first = full.output_token_ids.index(stop)
    out = llm.generate([PROMPT], [SamplingParams(max_tokens=30, temperature=0.3, seed=7,
                                                 ignore_eos=True, stop_token_ids=[stop])])[0]
    assert out.output_token_ids == full.output_token_ids[: first + 1]
    assert out.finish_reason == "stop"
    assert out.spec.num_accepted_tokens <= len(out.output_token_ids) - 1


@pytest.mark.parametrize("verify,draft", [("standard", "probabilistic"), ("block", "greedy")])
def test_greedy_requests_stay_lossless_next_to_sampled_ones(trained_tiny, verify, draft):
    """A batch mixing temperature 0 and temperature 1 requests takes the sampling path for all of
    them; the greedy ones (one-hot target distributions) still emit exactly plain greedy tokens."""
    prompts = [[(5 * i + j) % 64 for j in range(2 + i % 5)] for i in range(8)]
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    plain = [o.output_token_ids for o in LLM(model=trained_tiny).generate(prompts, greedy)]
    params = [greedy if i % 2 == 0 else SamplingParams(max_tokens=16, temperature=1.0, seed=i,
                                                       ignore_eos=True) for i in range(8)]
    llm = LLM(model=trained_tiny, spec="mtp8", num_speculative_tokens=4, verify=verify,
              draft_sample_method=draft)
    outs = llm.generate(prompts, params)
    assert [outs[i].output_token_ids for i in range(0, 8, 2)] == plain[0::2]
    assert sum(outs[i].spec.num_accepted_tokens for i in range(0, 8, 2)) > 0
