"""The engine's online API (add_request / step / abort / has_unfinished_requests): requests fed
as they arrive decode exactly as LLM.generate does; bad use fails with one clear error."""
from __future__ import annotations

import pytest

from mtpx import SamplingParams
from mtpx.engine.engine import Engine, EngineConfig
from mtpx.core.request import Request
from mtpx.spec_decode import build_speculator
from tests.helpers import reference


def _req(i, prompt, n=8):
    return Request(i, prompt, SamplingParams(max_tokens=n, ignore_eos=True))


def test_requests_fed_between_steps_decode_like_plain_greedy(trained_tiny):
    prompts = [[5, 8, 11, 14], [20, 21, 22], [40, 42, 44, 46, 48], [9, 9, 9]]
    ref = reference(trained_tiny, prompts, [SamplingParams(max_tokens=8, ignore_eos=True)] * 4)
    eng = Engine(trained_tiny, build_speculator("mtp8", trained_tiny, 3),
                 EngineConfig(max_num_seqs=2, block_size=4, enable_prefix_caching=True,
                              check_invariants=True))
    done, pending, steps = {}, [_req(i, p) for i, p in enumerate(prompts)], 0
    while pending or eng.has_unfinished_requests():
        if pending and steps % 2 == 0:                  # one arrival every other step
            assert eng.add_request(pending.pop(0))
        for r in eng.step():
            done[r.index] = r.output_token_ids
        steps += 1
    assert [done[i] for i in range(4)] == ref
    assert eng.kv.num_free_blocks == eng.config.num_blocks and eng.cache.num_free_rows() == 2


def test_abort_between_steps_and_bad_use(trained_tiny):
    eng = Engine(trained_tiny, build_speculator("mtp1", trained_tiny, 2), EngineConfig(block_size=4))
    a, b = _req(0, [5, 8, 11], n=30), _req(1, [1, 2, 3], n=30)
    assert eng.add_request(a) and eng.add_request(b)
    with pytest.raises(ValueError, match="request id 0 is already in the engine"):
        eng.add_request(_req(0, [7, 7]))
    eng.step()
    eng.step()
    eng.abort(a)
    assert a.finish_reason == "abort" and eng.pop_aborted() == [a] and eng.pop_aborted() == []
    eng.abort(a)                                         # a second abort is a no-op
    assert eng.pop_aborted() == []
    while eng.has_unfinished_requests():
        eng.step()
    assert b.finish_reason == "length" and len(b.output_token_ids) == 30
    with pytest.raises(ValueError, match="already run"):
        eng.add_request(b)
    assert eng.step() == []                              # nothing to do: an empty step
    small = Engine(trained_tiny, None, EngineConfig(block_size=4, num_blocks=3))
    too_big = Request(2, [1] * 10, SamplingParams(max_tokens=8, ignore_eos=True))
    assert small.add_request(too_big) is False and "engine.num_blocks" in too_big.error
    assert not small.has_unfinished_requests()


def test_llm_takes_engine_settings_as_overrides(trained_tiny):
    from mtpx import LLM
    llm = LLM(model=trained_tiny, spec="mtp1", block_size=4, engine_config=EngineConfig(max_num_seqs=3))
    assert (llm.engine.config.block_size, llm.engine.config.max_num_seqs) == (4, 3)
    with pytest.raises(ValueError,
                       match=r"unknown engine setting 'blok_size' \(engine.blok_size\): did you mean "
                             r"block_size\?"):
        LLM(model=trained_tiny, blok_size=4)
    with pytest.raises(ValueError, match="engine.block_size=0: must be an integer >= 1"):
        Engine(trained_tiny, None, block_size=0)


def test_bad_prompts_fail_alone_at_add_request(trained_tiny):
    """The online API validates what LLM.generate validates: a bad prompt fails alone, with one
    line, and the engine goes on serving the others."""
    eng = Engine(trained_tiny, build_speculator("mtp8", trained_tiny, 2), max_model_len=32)
    bad = {"empty prompt": [], "maximum length is 32": list(range(2, 40)),
           "outside the vocabulary": [5, 64, -1]}
    for i, (msg, prompt) in enumerate(bad.items()):
        r = _req(i, prompt)
        assert eng.add_request(r) is False and msg in r.error
    good = _req(9, [5, 8, 11], n=4)
    assert eng.add_request(good)
    while eng.has_unfinished_requests():
        eng.step()
    assert good.finish_reason == "length" and len(good.output_token_ids) == 4


def test_bad_prompts_of_every_kind_fail_alone():
    """What the issue's users passed: each bad prompt gets its own error, the others run."""
    from mtpx import SamplingParams
    from tests.helpers import make_llm, peaked_model, tiny_config
    llm = make_llm(peaked_model(tiny_config()), tokenizer=_ByteTokenizer())
    outs = llm.generate(["ab", "\ud800 lone surrogate", b"bytes", None, [1, 2.5], [5, True], [3, 4]],
                        SamplingParams(max_tokens=2))
    errors = [o.error for o in outs]
    assert errors[0] is None and errors[6] is None and len(outs[6].output_token_ids) == 2
    assert errors[1].startswith("prompt is not valid Unicode text (surrogates not allowed at character 0")
    assert errors[2] == "prompt is bytes: decode it to str first (e.g. p.decode('utf-8'))"
    assert errors[3] == ("prompt has type NoneType: give a string, a list of token ids, {'prompt': text} or "
                         "{'prompt_token_ids': ids}")
    assert errors[4] == "token ids must be integers: got 2.5 (float)"
    assert errors[5] == "token ids must be integers: got True (bool)"


def test_sampling_params_refuse_what_they_cannot_honour():
    from mtpx import SamplingParams
    for kwargs, message in (({"seed": 2**70},
                             "seed=1180591620717411303424: must be an integer in [0, 2**64)"),
                            ({"seed": -1}, "seed=-1: must be an integer in [0, 2**64)"),
                            ({"max_tokens": 2.5}, "max_tokens=2.5: must be an integer >= 1"),
                            ({"top_k": 1.5}, "top_k=1.5: must be an integer"),
                            ({"stop_token_ids": "ab"}, "stop_token_ids='ab': must be a list of token ids")):
        with pytest.raises(ValueError) as e:
            SamplingParams(**kwargs)
        assert str(e.value).startswith(message)
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1


class _ByteTokenizer:
    """Token id = byte value + 2 (a stand-in with the tokenizers API the LLM uses)."""
    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text):
        return self._Enc([b % 30 + 2 for b in text.encode("utf-8")])

    def decode(self, ids, skip_special_tokens=True):
        return ""
