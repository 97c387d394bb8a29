"""Structured output through the engine (docs/structured_output.md): every constrained output
matches its constraint, greedy output under speculation (mtp1, mtp8, automatic k; eager;
preemption and prefix caching) is token-identical to plain decoding under the same constraint,
sampled output keeps the constrained target distribution (an exact joint, as tests/test_sampling.py),
allowed_token_ids and bad_words hold, and bad constraints are one line naming the field.

The tiny checkpoint's random model does not know JSON: the constraints are bounded (maxLength,
integer ranges, bounded regexes) so that every output ends inside max_tokens, and its
unconstrained drafts are often forbidden, which exercises the window ending at a forbidden draft.
The 200-request run over the demo is tools/bench_structured.py (experiments/structured_output).
"""
import json
import re
from collections import Counter

import pytest
import torch

from mtpx import LLM, SamplingParams, StructuredOutputsParams
from mtpx.spec_decode.sampler import probs_from_logits
from tests.helpers import peaked_model, tiny_config
from tests.test_sampling import tv

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "n": {"type": "integer", "minimum": 0, "maximum": 999},
    "ok": {"type": "boolean"},
    "tag": {"enum": ["a", "bb", "ccc"]}},
    "required": ["name", "n", "ok", "tag"], "additionalProperties": False}
REGEX = r"(def|class) [a-z]{1,6}\((x|y)?\):"
CHOICES = ["return x", "return y + 1", "pass"]
GRAMMAR = 'root ::= "(" num (("+" | "*") num){0,3} ")"\nnum ::= [0-9]{1,3}'
LARK = 'start: "[" item ("," item)~0..2 "]"\nitem: /[a-f]{1,4}/'


def constraints():
    return [("json", StructuredOutputsParams(json=SCHEMA)),
            ("json_compact", StructuredOutputsParams(json=json.dumps(SCHEMA), disable_any_whitespace=True)),
            ("regex", StructuredOutputsParams(regex=REGEX)),
            ("choice", StructuredOutputsParams(choice=CHOICES)),
            ("grammar", StructuredOutputsParams(grammar=GRAMMAR)),
            ("lark", StructuredOutputsParams(grammar=LARK)),
            ("json_object", StructuredOutputsParams(json_object=True))]


def valid(kind: str, text: str) -> bool:
    """Whether text matches the constraint `kind` of constraints()."""
    if kind in ("json", "json_compact"):
        try:
            x = json.loads(text)
        except ValueError:
            return False
        return (set(x) == {"name", "n", "ok", "tag"} and len(x["name"]) <= 6 and 0 <= x["n"] <= 999
                and isinstance(x["ok"], bool) and x["tag"] in ("a", "bb", "ccc")
                and (kind == "json" or text == json.dumps(x, ensure_ascii=False)))   # no extra whitespace
    if kind == "json_object":
        try:
            return isinstance(json.loads(text), dict)
        except ValueError:
            return False
    pattern = {"regex": REGEX, "choice": "|".join(map(re.escape, CHOICES)),
               "grammar": r"\([0-9]{1,3}([+*][0-9]{1,3}){0,3}\)",
               "lark": r"\[[a-f]{1,4}(,[a-f]{1,4}){0,2}\]"}[kind]
    return re.fullmatch(pattern, text) is not None


PROMPTS = ["def f(x):", "Question: what?\nAnswer:", "    return x + 1\n", "class A:", "x", "Answer: 42\n"]


def _requests(n: int):
    """n (kind, prompt, params): the constraints in turn over the prompts, greedy."""
    cs = constraints()
    out = []
    for i in range(n):
        kind, c = cs[i % len(cs)]
        out.append((kind, PROMPTS[i % len(PROMPTS)], SamplingParams(max_tokens=160, structured_outputs=c)))
    return out


def _run(llm: LLM, reqs):
    outs = llm.generate([p for _, p, _ in reqs], [sp for _, _, sp in reqs], use_tqdm=False)
    for (kind, _, _), o in zip(reqs, outs):
        c = o.outputs[0]
        assert c.finish_reason == "stop" and valid(kind, c.text), (kind, c.text, c.finish_reason)
    return outs


@pytest.fixture(scope="module")
def plain_outputs(tiny_ckpt):
    reqs = _requests(14)
    return reqs, _run(LLM(model=tiny_ckpt, max_num_seqs=16), reqs)


def test_mixed_constraints_are_valid_and_equal_plain_decoding_under_mtp8(tiny_ckpt, plain_outputs):
    """Every constraint kind over a real byte-level BPE tokenizer, 16 requests at once."""
    reqs, plain = plain_outputs
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=4, max_num_seqs=16)
    outs = _run(llm, reqs)
    for a, b in zip(outs, plain):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert sum(o.spec.num_draft_tokens for o in outs) > 0
    masks = llm.engine.runner.grammars
    assert masks.num_masked > 0


ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"


def letters_tokenizer(chars: str):
    """One token per character, <eos> = id 0 (raw strings, no merges): vocabulary 1 + len(chars)."""
    from tokenizers import Tokenizer, decoders, models
    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(["<eos>"])
    tok.decoder = decoders.Fuse()
    return tok


def _auto_k_costs(path):
    """A step-cost file under which drafting pays (automatic k without a start-up calibration)."""
    from mtpx.auto_k.store import save_step_costs
    save_step_costs(path, {(k, b): (10.0 + 1.0 * k) * (1 + 0.05 * b) for k in range(5) for b in (1, 8)}, {})
    return path


# the trained tiny model continues arithmetic sequences over ids 2..61; these constraints forbid some
# of its continuations, so drafts are accepted, rejected by the target, and forbidden by the grammar
TINY_CONSTRAINTS = [StructuredOutputsParams(regex="[^a-e]{4,30}"),
                    StructuredOutputsParams(regex="[0-9A-Z]{2}([^P-T][^a-c]){2,12}"),
                    StructuredOutputsParams(grammar='root ::= [A-Za-z]{1,10} "_" [0-9a-z]{1,20}')]
CASES = [
    ("mtp8", 4, {"enable_prefix_caching": True, "num_blocks": 16, "block_size": 8}),
    ("mtp8", "auto", {}),
    pytest.param("mtp1", 3, {"verify": "block"}, marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def tiny_plain(trained_tiny):
    tok = letters_tokenizer(ALPHABET)
    prompts = [[(7 * i + j) % 60 + 2 for j in range(5 + 3 * i)] for i in range(6)]
    reqs = [(p, SamplingParams(max_tokens=40, structured_outputs=TINY_CONSTRAINTS[i % 3]))
            for i, p in enumerate(prompts)]
    outs = LLM(model=trained_tiny, tokenizer=tok, max_num_seqs=8).generate(
        [p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
    return tok, reqs, outs


@pytest.mark.parametrize("spec,k,extra", CASES)
def test_greedy_constrained_output_equals_plain_decoding(trained_tiny, tiny_plain, tmp_path, spec, k, extra):
    """mtp8 (with prefix caching and preemption: 16 blocks of 8 for 6 requests), automatic k and
    mtp1 with block verification: the same tokens as plain decoding under the same constraints."""
    tok, reqs, plain = tiny_plain
    if k == "auto":
        extra = {"cost_model_file": _auto_k_costs(tmp_path / "costs.json")}
    llm = LLM(model=trained_tiny, tokenizer=tok, spec=spec, num_speculative_tokens=k, max_num_seqs=8, **extra)
    outs = llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
    for (_, sp), a, b in zip(reqs, outs, plain):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        pattern = sp.structured_outputs.regex or r"[A-Za-z]{1,10}_[0-9a-z]{1,20}"
        assert a.outputs[0].finish_reason == "stop" and re.fullmatch(pattern, a.outputs[0].text), a.outputs[0]
    drafted = sum(o.spec.num_draft_tokens for o in outs)
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    assert 0 < accepted < drafted
    if "num_blocks" in extra:
        assert llm.engine.num_preemptions > 0


def test_window_columns_follow_the_drafts(trained_tiny, tiny_plain, monkeypatch):
    """Column j of a window is masked with the grammar state after drafts d_1 .. d_j: the tokens
    each column allows are those a matcher allows after the committed output plus those drafts."""
    import xgrammar as xgr
    from mtpx.structured import masks as masks_mod
    seen = []
    apply = masks_mod.GrammarMasks.apply

    def recording(self, reqs, logits, raw, drafts=None):
        out = apply(self, reqs, logits, raw, drafts)
        if drafts is not None:
            seen.append(([list(r.output_token_ids) for r in reqs], drafts, out.clone(), list(reqs)))
        return out
    monkeypatch.setattr(masks_mod.GrammarMasks, "apply", recording)
    tok, reqs, _ = tiny_plain
    llm = LLM(model=trained_tiny, tokenizer=tok, spec="mtp8", num_speculative_tokens=4)
    llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
    checked = 0
    for outputs, drafts, out, reqs in seen:
        for b, r in enumerate(reqs):
            m = xgr.GrammarMatcher(r.grammar)
            for t in outputs[b]:
                assert m.accept_token(t)
            for j in range(len(drafts[b]) + 1):
                if m.is_terminated():
                    break
                bitmask = xgr.allocate_token_bitmask(1, out.shape[-1])
                m.fill_next_token_bitmask(bitmask)
                expect = torch.zeros(1, out.shape[-1])
                xgr.apply_token_bitmask_inplace(expect, bitmask)
                assert torch.equal(torch.isneginf(out[b, j]), torch.isneginf(expect[0]))
                checked += j > 0
                if j == len(drafts[b]) or not m.accept_token(drafts[b][j]):
                    break
    assert checked > 20                          # columns after accepted drafts were checked


def test_drafts_under_the_mask_follow_the_grammar(trained_tiny, tiny_plain, monkeypatch):
    """With engine.structured_outputs_mask_drafts (the default) no window holds a draft the
    grammar forbids after the committed output and the drafts before it, the output is plain
    decoding's, and more drafts are accepted than with unmasked drafts, where the tiny model's
    drafts are often forbidden (the same engine, the key toggled)."""
    import xgrammar as xgr
    from mtpx.structured import masks as masks_mod
    windows = []
    apply = masks_mod.GrammarMasks.apply

    def recording(self, reqs, logits, raw, drafts=None):
        if drafts is not None:
            windows.extend((r.grammar, list(r.output_token_ids), d) for r, d in zip(reqs, drafts) if d)
        return apply(self, reqs, logits, raw, drafts)
    monkeypatch.setattr(masks_mod.GrammarMasks, "apply", recording)
    tok, reqs, plain = tiny_plain
    llm = LLM(model=trained_tiny, tokenizer=tok, spec="mtp8", num_speculative_tokens=4)
    forbidden, accepted = {}, {}
    for mask in (True, False):
        llm.engine.runner.config.structured_outputs_mask_drafts = mask
        windows.clear()
        outs = llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
        accepted[mask] = sum(o.spec.num_accepted_tokens for o in outs)
        forbidden[mask] = 0
        for grammar, output, drafts in windows:
            m = xgr.GrammarMatcher(grammar)
            assert all(m.accept_token(t) for t in output)
            for t in drafts:
                if m.is_terminated():
                    break
                if not m.accept_token(t):
                    forbidden[mask] += 1
                    break
        assert len(windows) > 10
    assert forbidden[True] == 0 and forbidden[False] > 5, forbidden
    assert accepted[True] > accepted[False], accepted
    assert llm.engine.runner.grammars.draft_seconds > 0


class _Req:
    """What GrammarMasks reads of a Request."""
    def __init__(self, index, grammar, output=()):
        self.index, self.grammar, self.output_token_ids, self.finished = index, grammar, list(output), False


def test_draft_sampler_masks_each_draft_and_renormalises_q():
    """GrammarDraftSampler: draft i of a constrained row comes from its draft logits masked by the
    grammar state after the step's emitted tokens and drafts 0..i-1; a forced token is the draft
    whatever its logit; the draft distribution q (probabilistic drafts) is the masked,
    renormalised one, exactly, and an unconstrained row's is untouched; the matcher is back at
    the committed output at its next use."""
    from mtpx.spec_decode.sampler import DraftSampler, RequestSampling
    from mtpx.structured.drafts import GrammarDraftSampler
    from mtpx.structured.grammar import GrammarCompiler
    from mtpx.structured.masks import GrammarMasks
    chars = "abcdefg"
    tok = letters_tokenizer(chars)
    V = 1 + len(chars)
    grammar = GrammarCompiler(tok, V, [0]).compile(StructuredOutputsParams(regex="ab[cd]e[a-g]{1,3}"))
    reqs = [_Req(0, grammar, [tok.token_to_id("a")]), _Req(1, None)]
    ps = [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=0.8, seed=2)]
    sampling = RequestSampling(ps, [torch.Generator().manual_seed(p.seed) for p in ps], torch.device("cpu"))
    masks = GrammarMasks()
    inner = DraftSampler(sampling, [3, 3], 3, probabilistic=True)
    pending = [[tok.token_to_id("b")], [tok.token_to_id("g")]]      # emitted this step
    sampler = GrammarDraftSampler(masks, reqs, pending, [3, 3], inner)
    logits = torch.randn(3, 3, V, generator=torch.Generator().manual_seed(0))   # 3 rows: one padding
    logits[0, 1, tok.token_to_id("e")] = -30.0           # "e" is forced at draft 1 all the same
    allowed = [set("cd"), set("e"), set(chars)]
    drafts = []
    for i in range(3):
        d = sampler(logits[:, i], i)
        keep = torch.tensor([tok.id_to_token(t) in allowed[i] for t in range(V)])
        masked = logits[0, i].masked_fill(~keep, float("-inf"))
        assert torch.equal(sampler.q[0, i], sampling.probs(masked[None], torch.tensor([0]))[0])
        assert torch.equal(sampler.q[1, i], sampling.probs(logits[1:2, i], torch.tensor([1]))[0])
        assert tok.id_to_token(int(d[0])) in allowed[i]
        drafts.append(tok.id_to_token(int(d[0])))
    assert drafts[1] == "e"
    fresh = xgr_mask(grammar, reqs[0].output_token_ids, V)
    assert torch.equal(xgr_mask(None, None, V, masks.matcher(reqs[0])), fresh)   # rolled back


def xgr_mask(grammar, output, V, matcher=None):
    """The allowed tokens [V] bool of a matcher (a fresh one of `grammar` after `output`)."""
    import xgrammar as xgr
    if matcher is None:
        matcher = xgr.GrammarMatcher(grammar)
        for t in output:
            assert matcher.accept_token(t)
    bitmask = xgr.allocate_token_bitmask(1, V)
    matcher.fill_next_token_bitmask(bitmask)
    x = torch.zeros(1, V)
    xgr.apply_token_bitmask_inplace(x, bitmask)
    return ~torch.isneginf(x[0])


def _contains(ids: list[int], seq: list[int]) -> bool:
    return any(ids[i:i + len(seq)] == seq for i in range(len(ids) - len(seq) + 1))


def test_allowed_token_ids_and_bad_words(tiny_ckpt):
    from mtpx.engine.llm import bad_words_token_ids
    plain, spec = LLM(model=tiny_ckpt), LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=4)
    tok = plain.get_tokenizer()
    allowed = sorted(set(tok.encode("x + 1 return y").ids))
    free = plain.generate(PROMPTS[:3], SamplingParams(max_tokens=24, ignore_eos=True), use_tqdm=False)
    common = Counter(t for o in free for t in o.outputs[0].token_ids).most_common(1)[0][0]
    word = tok.decode([common]).strip() or "x"
    seqs = bad_words_token_ids([word], tok)
    assert any(_contains(o.outputs[0].token_ids, s) for o in free for s in seqs)   # the ban has work
    for sp in (SamplingParams(max_tokens=24, allowed_token_ids=allowed, ignore_eos=True),
               SamplingParams(max_tokens=24, bad_words=[word], ignore_eos=True)):
        a = plain.generate(PROMPTS[:3], sp, use_tqdm=False)
        b = spec.generate(PROMPTS[:3], sp, use_tqdm=False)
        for x, y in zip(a, b):
            ids = x.outputs[0].token_ids
            assert ids == y.outputs[0].token_ids and len(ids) == 24
            if sp.allowed_token_ids:
                assert set(ids) <= set(allowed)
            else:
                assert not any(_contains(ids, s) for s in seqs), (word, seqs, ids)


@pytest.mark.parametrize("bad,field", [
    (dict(regex="[a-"), "structured_outputs.regex"),
    (dict(json='{"type": "objectx"}'), "structured_outputs.json"),
    (dict(json="{not json"), "structured_outputs.json"),
    (dict(grammar='root ::= foo'), "structured_outputs.grammar"),
    (dict(regex="[^\\s\\S]"), "structured_outputs.regex"),     # valid, but no token can start it
])
def test_invalid_constraints_are_one_line_naming_the_field(tiny_ckpt, bad, field):
    llm = LLM(model=tiny_ckpt)
    with pytest.raises(ValueError) as e:
        llm.generate(["x"], SamplingParams(structured_outputs=StructuredOutputsParams(**bad)), use_tqdm=False)
    assert str(e.value).startswith(field) and "\n" not in str(e.value), str(e.value)


def test_params_errors_name_the_field():
    with pytest.raises(ValueError, match="exactly one of .* got 2 .json, regex"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="got 0"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="structured_outputs.choice"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words="abc")
    sp = SamplingParams(structured_outputs={"regex": "a+"})
    assert sp.structured_outputs.kind == "regex"


def test_engine_disable_any_whitespace(tiny_ckpt):
    """vLLM's structured_outputs_config.disable_any_whitespace (engine-wide): every JSON constraint
    gives compact JSON, the outputs of requests that ask for it themselves, under mtp8 too."""
    sps = [SamplingParams(max_tokens=160, structured_outputs=StructuredOutputsParams(json=SCHEMA, **kw))
           for kw in ({}, {"disable_any_whitespace": True})]
    default = LLM(model=tiny_ckpt, max_num_seqs=8)
    loose, compact = (default.generate(PROMPTS[:3], sp, use_tqdm=False) for sp in sps)
    assert any(not valid("json_compact", o.outputs[0].text) for o in loose)       # whitespace there
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=4, max_num_seqs=8,
              structured_outputs_config={"disable_any_whitespace": True})
    assert llm.engine.config.structured_outputs_disable_any_whitespace
    outs = llm.generate(PROMPTS[:3], sps[0], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in compact]
    assert all(valid("json_compact", o.outputs[0].text) for o in outs), [o.outputs[0].text for o in outs]
    with pytest.raises(ValueError, match="^structured_outputs_config: backend not supported"):
        LLM(model=tiny_ckpt, structured_outputs_config={"backend": "guidance"})


def test_compiled_grammars_are_cached_per_constraint(tiny_ckpt):
    llm = LLM(model=tiny_ckpt)
    sps = [SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(json=dict(SCHEMA)))
           for _ in range(3)]
    llm.generate(["x"] * 3, sps, use_tqdm=False)
    assert llm._grammars.num_compiled == 1
    llm.generate(["x"], SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(
        json=json.dumps(SCHEMA, sort_keys=True))), use_tqdm=False)      # its canonical text: the same key
    assert llm._grammars.num_compiled == 1
    llm.generate(["x"], SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(
        json=dict(SCHEMA, required=["n"]))), use_tqdm=False)
    assert llm._grammars.num_compiled == 2


# ---- the constrained target distribution at T > 0 ----------------------------------------------
N = 3000
TV_MAX = 0.08
PROMPT = [5, 3, 1, 6]
DIST_REGEX = "[abc][bcde][a-g]"          # three tokens, each from its own set


def _exact_constrained_joint(model, params: SamplingParams, tok) -> dict:
    """P(first 3 tokens) of the target with the regex's mask at each position, exactly."""
    sets = [set("abc"), set("bcde"), set("abcdefg")]
    out = {(): 1.0}
    with torch.no_grad():
        for pos in range(3):
            nxt = {}
            for s, ps in out.items():
                logits = model.lm_head(model.model(torch.tensor([PROMPT + list(s)]))[:, -1]).clone()
                for t in range(8):
                    if tok.id_to_token(t) not in sets[pos]:
                        logits[0, t] = float("-inf")
                p = probs_from_logits(logits, torch.tensor([params.temperature], dtype=torch.float64),
                                      torch.tensor([params.top_k]), torch.tensor([params.top_p]),
                                      torch.tensor([params.min_p]))[0]
                for t in (p > 0).nonzero()[:, 0].tolist():
                    nxt[s + (t,)] = ps * float(p[t])
            out = nxt
    return out


@pytest.mark.slow      # about 25 s a case on one core (pytest -m slow tests/test_structured_output.py)
@pytest.mark.parametrize("spec,k,verify,draft", [("mtp8", 4, "block", "probabilistic"),
                                                 ("mtp1", 3, "standard", "greedy"),
                                                 ("mtp8", 4, "standard", "probabilistic")])
def test_sampled_output_has_the_constrained_target_distribution(spec, k, verify, draft):
    model, tok = peaked_model(tiny_config(vocab_size=8)), letters_tokenizer("abcdefg")
    llm = LLM(model=model, tokenizer=tok, spec=spec, num_speculative_tokens=k, verify=verify,
              draft_sample_method=draft, max_num_seqs=512, max_num_batched_tokens=8192)
    c = StructuredOutputsParams(regex=DIST_REGEX)
    ps = [SamplingParams(max_tokens=3, temperature=1.5, seed=i, ignore_eos=True, structured_outputs=c)
          for i in range(N)]
    outs = llm.generate([PROMPT] * N, ps, use_tqdm=False)
    counts = Counter(tuple(o.outputs[0].token_ids) for o in outs)
    exact = _exact_constrained_joint(model, ps[0], tok)
    d = tv(counts, exact, N)
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    drafted = sum(o.spec.num_draft_tokens for o in outs)
    assert 0 < accepted < drafted
    assert llm.engine.runner.grammars.draft_seconds > 0       # drafts proposed under the mask
    assert d < TV_MAX, d
    # the check has power: the unconstrained target's joint is far from the constrained one
    from tests.test_sampling import exact_joint
    assert tv(counts, exact_joint(model, SamplingParams(temperature=1.5)), N) > 3 * TV_MAX


def test_eval_splits_acceptance_by_constraint(tiny_ckpt, tmp_path):
    """mode=eval with eval.structured_outputs on every other request: metrics.json's
    structured_outputs counts each group's rounds exactly as outputs.jsonl's per-request rounds,
    the grammar masks' ms per step are recorded, the report prints the split, W&B gets it as
    scalars, and the constrained outputs match (greedy: lossless against plain decoding under
    the same constraints)."""
    from tests.test_cli import _cfg
    from mtpx.evaluate import run_eval
    from mtpx.metrics.logging import structured_scalars
    cfg = _cfg([f"model.path={tiny_ckpt}", "+spec=mtp8", "spec.num_speculative_tokens=3",
                "eval.num_prompts=4", "eval.max_tokens=12", "logger=none", "eval.concurrency=4",
                "eval.structured_outputs={regex: '[a-z ]{3,20}'}", "eval.structured_outputs_every=2"])
    assert run_eval(cfg, tmp_path) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    so = metrics["structured_outputs"]
    assert metrics["lossless_mismatches"] == 0 and so["mask_ms_per_step"] > 0 and so["num_steps"] > 0
    for label, group in (("constrained", rows[0::2]), ("unconstrained", rows[1::2])):
        rounds = [r for row in group for r in row["rounds"]]
        v = so["by_constraint"][label]
        assert v["num_requests"] == 2 and v["num_drafts"] == len(rounds) > 0
        assert v["num_draft_tokens"] == sum(r[0] for r in rounds)
        assert v["num_accepted_tokens"] == sum(r[1] for r in rounds)
        assert v["per_position_acceptance"] == [sum(r[1] > i for r in rounds) / len(rounds) for i in range(3)]
    assert all(re.fullmatch("[a-z ]{3,20}", row["text"]) for row in rows[0::2])
    assert "Acceptance by constraint" in (tmp_path / "report.txt").read_text()
    scalars = structured_scalars(so)
    assert scalars["structured_outputs/constrained/acceptance_length"] == so["by_constraint"]["constrained"][
        "acceptance_length"] and "structured_outputs/unconstrained/per_position_acceptance/pos_2" in scalars
