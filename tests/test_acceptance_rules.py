"""The acceptance rules of spec.acceptance (mtpx/spec_decode/acceptance.py): each rule's accept /
reject decision on hand-made distributions, exactly; each rule at its neutral setting equal to the
lossless rule (its acceptance probabilities bit for bit on random distributions, and the engine's
tokens for mtp1, mtp8 and automatic k, greedy and seeded sampling); synthetic's per-position
rates within a binomial tolerance; bad settings as one line naming the key. The slow ones
(`python -m pytest -q -m slow tests/test_acceptance_rules.py`): seeded sampling through the engine,
mtp1, automatic k and the compiled step."""
import math

import pytest
import torch

from mtpx import LLM, SamplingParams
from mtpx.spec_decode.acceptance import (AcceptanceConfig, AcceptanceRule, cascade_probs,
                                         conditional_rates, lenient_probs, relaxed_probs, typical_probs)
from mtpx.spec_decode.verification import token_acceptance_probs, verify_token_level

D = torch.float64
# one request, K = 2 drafts, vocabulary 4: the target at the two draft positions and the bonus one
P = torch.tensor([[[0.5, 0.3, 0.15, 0.05], [0.4, 0.3, 0.2, 0.1], [1.0, 0.0, 0.0, 0.0]]], dtype=D)
X = torch.tensor([[1, 2]])
Q_GREEDY = torch.nn.functional.one_hot(X, 4).to(D)           # argmax drafts: one-hot q
ND = torch.tensor([2])


def _entropy(p):
    return -sum(v * math.log(v) for v in p if v > 0)


def test_lossless_reference_values():
    assert token_acceptance_probs(X, Q_GREEDY, P).tolist() == [[0.3, 0.2]]


def test_typical_exact():
    eps, delta = 0.2, 0.3
    thr = [min(eps, delta * math.exp(-_entropy(P[0, i].tolist()))) for i in range(2)]
    assert thr[0] == pytest.approx(0.0957, abs=1e-4) and thr[1] == pytest.approx(0.0834, abs=1e-4)
    # p(1) = 0.3 > 0.0957 and p(2) = 0.2 > 0.0834: both accepted for sure
    assert typical_probs(X, Q_GREEDY, P, eps, delta).tolist() == [[1.0, 1.0]]
    # a draft below the threshold keeps the lossless probability: p(3) = 0.05 < 0.0957
    x = torch.tensor([[3, 3]])
    q = torch.nn.functional.one_hot(x, 4).to(D)
    assert typical_probs(x, q, P, eps, delta).tolist() == [[0.05, 1.0]]   # p1(3) = 0.1 > 0.0834


def test_relaxed_exact():
    # top 2 with delta 0.25: draft 1 (p 0.3 >= 0.5 - 0.25, in the top 2) is a candidate accepted as
    # the top token (min(1, 0.5 / q)); draft 2 is outside the top 2 of [0.4, 0.3, 0.2, 0.1]
    a = relaxed_probs(X, Q_GREEDY, P, P, 2, 0.25)
    assert a.tolist() == [[0.5, 0.2]]
    assert relaxed_probs(X, Q_GREEDY, P, P, 3, 0.2).tolist() == [[0.5, 0.4]]
    assert relaxed_probs(X, Q_GREEDY, P, P, 3, 0.1).tolist() == [[0.3, 0.2]]  # 0.3 < 0.5 - 0.1
    # the decision: eta below a accepts, the first eta above rejects and samples the residual
    rule = AcceptanceRule(AcceptanceConfig("relaxed", relaxed_topk=2, relaxed_delta=0.25), 2)
    greedy = torch.tensor([False])
    m, final = rule(X, Q_GREEDY, P, ND, torch.tensor([[0.45, 0.1]], dtype=D), logits=P.log(), greedy=greedy)
    assert m.tolist() == [2] and final.tolist() == P[:, 2].tolist()
    m, final = rule(X, Q_GREEDY, P, ND, torch.tensor([[0.55, 0.1]], dtype=D), logits=P.log(), greedy=greedy)
    assert m.tolist() == [0]
    assert torch.allclose(final, torch.tensor([[0.5, 0.0, 0.15, 0.05]], dtype=D) / 0.7, atol=1e-15)


def test_relaxed_greedy_row_reads_the_softmax_of_the_logits():
    """At temperature 0 p is one-hot; candidates come from softmax(logits) (TensorRT-LLM's)."""
    logits = torch.tensor([[[2.0, 1.9, 0.0, -1.0], [3.0, 2.9, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]], dtype=D)
    p = torch.nn.functional.one_hot(logits.argmax(-1), 4).to(D)
    rule = AcceptanceRule(AcceptanceConfig("relaxed", relaxed_topk=2, relaxed_delta=0.05), 2)
    eta = torch.full((1, 2), 0.5, dtype=D)
    s = logits.softmax(-1)
    assert s[0, 0, 0] - s[0, 0, 1] < 0.05 and s[0, 1, 0] - s[0, 1, 1] < 0.05
    m, final = rule(X, Q_GREEDY, p, ND, eta, logits=logits, greedy=torch.tensor([True]))
    assert m.tolist() == [1]                     # draft 1 is a candidate, draft 2 (index 2) is not
    assert final.argmax(-1).tolist() == [0]      # then the target's argmax
    lossless, _ = verify_token_level(X, Q_GREEDY, p, ND, eta)
    assert lossless.tolist() == [0]


def test_lenient_exact():
    assert lenient_probs(X, Q_GREEDY, P, 2.0).tolist() == [[0.6, 0.4]]
    assert lenient_probs(X, Q_GREEDY, P, 5.0).tolist() == [[1.0, 1.0]]


def test_cascade_exact():
    q = torch.tensor([[[0.1, 0.8, 0.05, 0.05], [0.1, 0.3, 0.3, 0.3]]], dtype=D)
    x = torch.tensor([[1, 2]])
    greedy = torch.tensor([False])
    # position 0: max q 0.8 >= max p 0.5 - 0.05: no deferral, accepted (pi = q); position 1: max q
    # 0.3 < 0.4 - 0.05: defer, the lossless min(1, 0.2 / 0.3)
    a = cascade_probs(x, q, P, greedy, 0.05)
    assert a[0, 0] == 1.0 and a[0, 1] == pytest.approx(2 / 3, abs=1e-15)
    assert cascade_probs(x, q, P, greedy, 0.15).tolist() == [[1.0, 1.0]]  # 0.3 < 0.25 false
    lossless = token_acceptance_probs(x, q, P).tolist()
    assert cascade_probs(x, q, P, torch.tensor([True]), 0.15).tolist() == lossless


def test_synthetic_conditional_rates_and_decision():
    assert conditional_rates([0.8, 0.4, 0.2, 0.0, 0.0]) == [0.8, 0.5, 0.5, 0.0, 0.0]
    rule = AcceptanceRule(AcceptanceConfig("synthetic", synthetic_acceptance_rates=[1.0, 0.0]), 2)
    x = torch.tensor([[3, 3]])                   # drafts the target gives p = 0.05 and 0.1
    eta = torch.zeros(1, 2, dtype=D)
    m, final = rule(x, Q_GREEDY, P, ND, eta, logits=P.log(), greedy=torch.tensor([True]))
    assert m.tolist() == [1] and final.tolist() == P[:, 1].tolist()   # then the target's p, no residual


def test_synthetic_hits_its_rates():
    """20,000 rounds of 3 drafts: each position's acceptance within 4.5 binomial standard errors of
    its rate (a false failure has probability below 1e-5 per position)."""
    rates = [0.8, 0.5, 0.2]
    n = 20000
    rule = AcceptanceRule(AcceptanceConfig("synthetic", synthetic_acceptance_rates=rates), 3)
    x = torch.zeros(n, 3, dtype=torch.long)
    p = torch.full((n, 4, 4), 0.25, dtype=D)
    q = torch.nn.functional.one_hot(x, 4).to(D)
    eta = torch.rand(n, 3, dtype=D)
    m, _ = rule(x, q, p, torch.full((n,), 3), eta, logits=p, greedy=torch.ones(n, dtype=bool))
    for i, r in enumerate(rates):
        observed = (m > i).double().mean().item()
        assert abs(observed - r) < 4.5 * math.sqrt(r * (1 - r) / n), (i, observed, r)


NEUTRAL = {"typical": dict(posterior_threshold=1.0, posterior_alpha=1e9),
           "relaxed": dict(relaxed_topk=1, relaxed_delta=0.0),
           "lenient": dict(lenient_lambda=1.0),
           "cascade": dict(cascade_alpha=-1.0, draft_sample_method="probabilistic")}


@pytest.mark.parametrize("name", sorted(NEUTRAL))
def test_neutral_probabilities_equal_lossless_bit_for_bit(name):
    g = torch.Generator().manual_seed(1)
    B, K, V = 64, 4, 16
    p = torch.rand(B, K + 1, V, generator=g, dtype=D) ** 4
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(B, K, V, generator=g, dtype=D) ** 4
    q = q / q.sum(-1, keepdim=True)
    x = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K)
    eta = torch.rand(B, K, generator=g, dtype=D)
    nd = torch.randint(1, K + 1, (B,), generator=g)
    cfg = {k: v for k, v in NEUTRAL[name].items() if k != "draft_sample_method"}
    rule = AcceptanceRule(AcceptanceConfig(name, **cfg), K)
    m, final = rule(x, q, p, nd, eta, logits=p.log(), greedy=torch.zeros(B, dtype=bool))
    m0, final0 = verify_token_level(x, q, p, nd, eta)
    assert torch.equal(m, m0) and torch.equal(final, final0)
    assert 0 < (m0 < nd).sum() < B                  # accepts and rejections both happen


@pytest.mark.parametrize("name, cfg", [("relaxed", dict(relaxed_topk=3, relaxed_delta=0.3)),
                                       ("relaxed", dict(relaxed_topk=8, relaxed_delta=1.0)),
                                       ("relaxed", dict(relaxed_topk=1, relaxed_delta=0.0)),
                                       ("typical", dict(posterior_threshold=0.3, posterior_alpha=0.5)),
                                       ("lenient", dict(lenient_lambda=4.0)),
                                       ("cascade", dict(cascade_alpha=1.0))])
def test_greedy_fast_path_equals_the_general_path(name, cfg):
    """An all-greedy batch skips probabilities and uniforms (AcceptanceRule.verify_greedy): the same
    accepted counts and tokens as the general path (sampling.probs, the rule, the residual sample)."""
    from mtpx.spec_decode.sampler import RequestSampling
    from mtpx.spec_decode.verification import verify
    g = torch.Generator().manual_seed(2)
    B, T, V = 64, 5, 16
    logits = torch.randn(B, T, V, generator=g) * 2
    target = logits.argmax(-1)
    second = logits.topk(2, dim=-1).indices[..., 1]
    u = torch.rand(B, T, generator=g)                  # drafts: the target's argmax, its second, random
    ids = torch.where(u < 0.5, target.roll(1, 1), torch.where(u < 0.8, second.roll(1, 1),
                                                              torch.randint(0, V, (B, T), generator=g)))
    nd = torch.randint(0, T, (B,), generator=g).tolist()
    rule = AcceptanceRule(AcceptanceConfig(name, **cfg), T - 1)
    sampling = RequestSampling([SamplingParams(temperature=0.0)] * B, [None] * B, "cpu")
    fast = verify(ids, logits, nd, sampling, [None] * B, rule=rule)
    assert all(torch.equal(a, b) for a, b in zip(fast, rule.verify_greedy(ids, logits, torch.tensor(nd))))
    sampling.all_greedy = False                                  # the general path, greedy rows
    general = verify(ids, logits, nd, sampling, [None] * B, rule=rule)
    m = fast[0]
    assert torch.equal(m, general[0])
    for b in range(B):
        assert torch.equal(fast[1][b, : m[b] + 1], general[1][b, : m[b] + 1]), b
    lossless = verify(ids, logits, nd, sampling, [None] * B)[0]
    assert (m > lossless).any() == (name == "relaxed" and cfg["relaxed_topk"] > 1)


PROMPTS = [[5, 8, 11, 14], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [61, 2, 7, 33, 12]]


def _tokens(model, spec, k, temperature, **kw):
    llm = LLM(model=model, spec=spec, num_speculative_tokens=k, max_num_seqs=4, **kw)
    params = [SamplingParams(max_tokens=20, ignore_eos=True, temperature=temperature, seed=i)
              for i in range(len(PROMPTS))]
    outs = llm.generate(PROMPTS, params)
    return [o.output_token_ids for o in outs], sum(o.spec.num_accepted_tokens for o in outs)


def _neutral_equals_lossless(model, spec, k, temperature, need_accepts=True, **extra):
    lossless = {}
    for name, kw in NEUTRAL.items():
        if name == "cascade" and temperature == 0:
            continue                                # greedy rows always defer: nothing new to see
        draft = kw.get("draft_sample_method", "greedy")
        if draft not in lossless:
            lossless[draft], accepted = _tokens(model, spec, k, temperature, draft_sample_method=draft,
                                                **extra)
            assert 0 < accepted or not need_accepts
        got = _tokens(model, spec, k, temperature, acceptance=name, **{**kw, **extra})[0]
        assert got == lossless[draft], name
    if temperature == 0:                            # synthetic accepting nothing: plain decoding's tokens
        rates = [0.0] * (len(model.mtp) if k == "auto" else k)
        out, accepted = _tokens(model, spec, k, 0.0, acceptance="synthetic", synthetic_acceptance_rates=rates,
                                **extra)
        assert out == lossless["greedy"] and accepted == 0


@pytest.mark.parametrize("temperature", [0.0, pytest.param(1.0, marks=pytest.mark.slow)])
def test_neutral_settings_give_the_lossless_tokens(trained_tiny, temperature):
    """mtp8 through the engine (seeded sampling is slow-marked: its verifier-level twin, bit for bit,
    is test_neutral_probabilities_equal_lossless_bit_for_bit)."""
    _neutral_equals_lossless(trained_tiny, "mtp8", 4, temperature)


@pytest.mark.slow
@pytest.mark.parametrize("spec,k", [("mtp1", 2), ("mtp8", "auto")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_neutral_settings_give_the_lossless_tokens_mtp1_and_auto_k(trained_tiny, tmp_path, spec, k,
                                                                   temperature):
    """mtp1 and automatic k (its step costs calibrated once, then loaded)."""
    extra = {"cost_model_file": str(tmp_path / "costs.json")} if k == "auto" else {}
    # (auto may run k = 0 and mtp1's sampled greedy drafts may all be rejected here: equality only)
    _neutral_equals_lossless(trained_tiny, spec, k, temperature, need_accepts=False, **extra)


def test_lossy_settings_change_the_output(trained_tiny):
    """The neutral test is not vacuous: a wide relaxed rule accepts more and changes tokens."""
    lossless, acc0 = _tokens(trained_tiny, "mtp8", 4, 0.0)
    out, acc = _tokens(trained_tiny, "mtp8", 4, 0.0, acceptance="relaxed", relaxed_topk=8, relaxed_delta=0.5)
    assert acc > acc0 and out != lossless


@pytest.mark.parametrize("kw, message", [
    (dict(acceptance="relaxed", relaxed_delta=-0.1), "spec.relaxed_delta=-0.1: must be a number in [0, 1]"),
    (dict(acceptance="relaxed", relaxed_topk=0), "spec.relaxed_topk=0: must be an integer >= 1"),
    (dict(acceptance="typical", posterior_alpha=-1.0), "spec.posterior_alpha=-1.0: must be a number >= 0"),
    (dict(acceptance="lenient", lenient_lambda=0.5), "spec.lenient_lambda=0.5: must be a finite number >= 1"),
    (dict(acceptance="synthetic", synthetic_acceptance_rates=[0.5, 1.5]), "spec.synthetic_acceptance_rates="),
    (dict(acceptance="synthetic", synthetic_acceptance_rates=[0.5, 0.6]), "non-increasing"),
    (dict(acceptance="synthetic"), "spec.acceptance=synthetic needs spec.synthetic_acceptance_rates"),
    (dict(acceptance="synthetic", synthetic_acceptance_rates=[0.5]),
     "has 1 rates for num_speculative_tokens=2"),
    (dict(acceptance="typical", verify="block"), "set spec.verify=standard"),
    (dict(acceptance="cascade"), "set spec.draft_sample_method=probabilistic"),
    (dict(acceptance="lossy"), "spec.acceptance='lossy': choose one of lossless, typical"),
])
def test_bad_settings_one_line(trained_tiny, kw, message):
    with pytest.raises(ValueError) as e:
        LLM(model=trained_tiny, spec="mtp8", num_speculative_tokens=2, **kw)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_speculative_config_keys(trained_tiny):
    llm = LLM(model=trained_tiny, speculative_config={"method": "mtp", "num_speculative_tokens": 2,
                                                      "acceptance": "relaxed", "relaxed_topk": 3})
    assert llm.engine.config.acceptance == "relaxed" and llm.engine.config.relaxed_topk == 3
    synthetic = LLM(model=trained_tiny, speculative_config={  # vLLM's names
        "method": "mtp", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [0.5, 0.25]})
    assert synthetic.engine.config.acceptance == "synthetic"


@pytest.mark.slow
def test_rules_in_the_compiled_step(trained_tiny):
    """The rules run after the compiled verification forward: neutral settings give the eager lossless
    tokens, greedy and seeded, and a lossy setting accepts more (compile_backend=eager traces the step)."""
    compiled = dict(compile=True, compile_backend="eager")
    for temperature in (0.0, 1.0):
        lossless, acc0 = _tokens(trained_tiny, "mtp8", 4, temperature)
        neutral = _tokens(trained_tiny, "mtp8", 4, temperature, acceptance="relaxed", **compiled)[0]
        assert neutral == lossless
    out, acc = _tokens(trained_tiny, "mtp8", 4, 0.0, acceptance="relaxed", relaxed_topk=8, relaxed_delta=0.5,
                       **compiled)
    assert acc > acc0


@pytest.mark.slow      # one train_or_eval.py process a setting (5 s idle, up to 50 s on busy cores)
@pytest.mark.parametrize("overrides, line", [
    (["spec.acceptance=relaxed", "spec.relaxed_delta=-0.1"], "error: spec.relaxed_delta=-0.1: must be"),
    (["spec.acceptance=relaxed", "spec.relaxed_topk=0"], "error: spec.relaxed_topk=0: must be an integer"),
    (["spec.acceptance=synthetic", "spec.synthetic_acceptance_rates=[0.5,1.5,0,0,0,0,0,0]"],
     "error: spec.synthetic_acceptance_rates=[0.5, 1.5, 0.0"),
    (["spec.acceptance=typical", "eval.check_lossless=true"],
     "error: eval.check_lossless=true with spec.acceptance=typical: a lossy rule is not lossless"),
])
def test_bad_settings_one_line_from_the_cli(tmp_path, overrides, line):
    """The issue's bad settings through train_or_eval.py: exit 2, one stderr line naming the key."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(root / "train_or_eval.py"), "mode=eval", "+spec=mtp8",
                          "logger=none", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, cwd=root, timeout=300)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith(line)
