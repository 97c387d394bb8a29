"""Stop strings (mtpx/core/stop_strings.py): the window the checker decodes is measured in
text, so a stop string whose characters are separated by tokens that decode to "" (special
tokens, which decode skips) still ends the request at the token that completes it, in plain and
speculative decoding alike."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
import torch
from tokenizers import Tokenizer, decoders, models

from mtpx import LLM, SamplingParams
from mtpx.core.stop_strings import StopStrings
from tests.helpers import tiny_config

V = 64
X, Y = 10, 26                   # token X decodes to "x", Y to "y"; the 15 tokens between are special
SPECIAL = list(range(X + 1, Y))


def successor_model():
    """A model whose greedy next token after t is (t + 1) mod V, and whose every draft module
    predicts the same (so every draft is accepted): identity embeddings, decoder and module
    layers that add nothing, a shifted identity as lm_head, module fc = [I, 0]."""
    torch.manual_seed(0)
    from mtpx.models import MTPForCausalLM
    cfg = tiny_config(vocab_size=V, hidden_size=V)
    m = MTPForCausalLM(cfg).double().eval()
    with torch.no_grad():
        for layer in list(m.model.layers) + [mod.layers[0] for mod in m.mtp]:
            for p in layer.parameters():
                p.zero_()
        m.model.embed_tokens.weight.copy_(torch.eye(V))
        m.lm_head.weight.copy_(torch.roll(torch.eye(V), 1, 0) * 20)
        for mod in m.mtp:
            mod.fc.weight.copy_(torch.cat([torch.eye(V), torch.zeros(V, V)], 1))
    return m


def tokenizer() -> Tokenizer:
    """Token X -> "x", Y -> "y", the tokens between them special (decode skips them: ""), every
    other token "a"; decoding joins the pieces."""
    names = [f"<s{i}>" if i in SPECIAL else "x" if i == X else "y" if i == Y else f"a{i}" for i in range(V)]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="a0"))
    tok.add_special_tokens([names[i] for i in SPECIAL])
    tok.decoder = decoders.Replace("a", "")          # "a12" -> "12": digits, never "x" or "y"
    return tok


def test_the_test_tokenizer_skips_the_special_tokens():
    tok = tokenizer()
    assert tok.decode([X, *SPECIAL, Y], skip_special_tokens=True) == "xy"
    assert tok.decode([X - 1, X], skip_special_tokens=True) == "9x"


def test_checker_finds_a_stop_across_tokens_that_decode_to_nothing():
    tok = tokenizer()
    checker = StopStrings(["xy"], lambda ids: tok.decode(ids, skip_special_tokens=True))
    ids = [5, 6, X, *SPECIAL]
    assert all(checker.check(ids[:i]) is None for i in range(1, len(ids) + 1))
    assert checker.check(ids + [Y]) == "xy"


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp8", 4), ("mtp1", 3)])
def test_stop_across_special_tokens_ends_where_plain_text_does(spec, k):
    model, tok = successor_model(), tokenizer()
    prompt = [X - 5]                                        # then X - 4 .. X, the specials, Y, ...
    llm = LLM(model=model, tokenizer=tok, spec=spec, num_speculative_tokens=k)
    free = llm.generate([prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert free.output_token_ids == [(X - 4 + i) % V for i in range(40)]
    assert "xy" in free.text
    (o,) = llm.generate([prompt], SamplingParams(max_tokens=40, ignore_eos=True, stop=["xy"]))
    end = free.output_token_ids.index(Y) + 1                # the token that completes "xy": 20
    assert (o.finish_reason, o.stop_reason, len(o.output_token_ids)) == ("stop", "xy", end)
    assert o.output_token_ids == free.output_token_ids[:end]
    assert o.text == free.text[: free.text.find("xy")] == "6789"
    if spec is not None:
        assert o.spec.num_accepted_tokens > 0               # drafts accepted across the stop


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.tuples(st.sampled_from([X, Y, 0, 1, 12, 40]), st.integers(0, 20)), max_size=8),
       stop=st.lists(st.sampled_from(["xy", "x1", "yx", "12", "0x", "y40", "4"]), min_size=1, max_size=2))
def test_checker_stops_at_the_first_token_whose_text_holds_a_stop(pieces, stop):
    """Against decoding the whole output after every token; each piece is a token then a run of
    special tokens."""
    ids = [i for t, run in pieces for i in [t] + SPECIAL[:run % 15] + SPECIAL[: max(0, run - 15)]]
    tok = tokenizer()
    decode = lambda t: tok.decode(t, skip_special_tokens=True)   # noqa: E731
    checker = StopStrings(stop, decode)
    got = next((i for i in range(1, len(ids) + 1) if checker.check(ids[:i])), None)
    want = next((i for i in range(1, len(ids) + 1) if any(s in decode(ids[:i]) for s in stop)), None)
    assert got == want


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp8", 4)])
@pytest.mark.parametrize("stop,min_tokens,include,n,text", [
    (["3"], 0, False, 25, "6789xy272829"),                  # the first "3": token 30, the 25th
    (["3"], 26, False, 26, "6789xy27282930"),               # "3" of "30" came before token 26 ("31")
    (["3"], 27, False, 27, "6789xy2728293031"),             # token 27 is "32"
    (["3"], 27, True, 27, "6789xy27282930313"),
    (["03"], 26, False, 26, "6789xy2728293"),               # "03" spans "30" and "31": ends in token 26
    (["3", "y2"], 27, False, 27, "6789xy2728293031"),
])
def test_a_stop_string_before_min_tokens_does_not_end_or_cut_the_text(spec, k, stop, min_tokens, include, n,
                                                                       text):
    """vLLM's min_tokens: only a stop string that ends in the text of output token min_tokens or
    later ends the request, and the text is cut there (not at an earlier occurrence), so text,
    token ids and their count agree. Outputs: 6 7 8 9 x, 15 specials, y, 27 28 ...; the 25th
    output token is 30."""
    llm = LLM(model=successor_model(), tokenizer=tokenizer(), spec=spec, num_speculative_tokens=k)
    (o,) = llm.generate([[X - 5]], SamplingParams(max_tokens=40, ignore_eos=True, stop=stop,
                                                  min_tokens=min_tokens, include_stop_str_in_output=include))
    assert (o.finish_reason, len(o.output_token_ids), o.text) == ("stop", n, text)
    assert o.output_token_ids == [X - 4 + i for i in range(n)]
    assert o.text == llm.decode(o.output_token_ids)[:len(text)]


@pytest.mark.parametrize("stream", [False, True])
def test_the_server_cuts_at_the_stop_string_after_min_tokens(stream):
    """/v1/completions (streamed or not): text, token_ids and usage agree with the Python API's
    (the stop "3" of "30" comes before min_tokens=27; token 27, "32", ends the request)."""
    pytest.importorskip("uvicorn")
    import json
    from fastapi.testclient import TestClient
    from mtpx.serve.app import build_app
    llm = LLM(model=successor_model(), tokenizer=tokenizer(), spec="mtp8", num_speculative_tokens=4)
    body = {"prompt": [X - 5], "max_tokens": 40, "ignore_eos": True, "stop": ["3"], "min_tokens": 27,
            "return_token_ids": True, "stream": stream}
    with TestClient(build_app(llm, "tiny")) as client:
        r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        ids = [t for c in chunks if c["choices"] for t in c["choices"][0].get("token_ids") or []]
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        choice = r.json()["choices"][0]
        text, ids, finish = choice["text"], choice["token_ids"], choice["finish_reason"]
        assert r.json()["usage"]["completion_tokens"] == 27
    assert (text, ids, finish) == ("6789xy2728293031", [X - 4 + i for i in range(27)], "stop")
