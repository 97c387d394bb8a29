"""The Python API's bad arguments (issue 73) are one ValueError naming the argument and the fix,
never torch's own error: LLM's device and threads, SamplingParams' stop, stop_token_ids and
temperature, generate's sampling_params; a stop token id outside the vocabulary fails its request
with one line (as a logit_bias id does), a 400 naming stop_token_ids on the server."""
import math

import pytest
import torch

from mtpx import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(model=tiny_ckpt)


@pytest.mark.parametrize("kwargs,message", [
    ({"device": "cuda"} if not torch.cuda.is_available() else {"device": "cuda:99"},
     r"device='cuda(:99)?': (this torch build has no CUDA|no CUDA GPU is visible|\d+ CUDA GPU)"),
    ({"device": "tpu"}, r"device='tpu' is not a device torch knows: use 'cpu' or 'cuda'"),
    ({"device": "meta"}, r"device='meta': mtpx runs on 'cpu' or 'cuda'"),
    ({"threads": -2}, r"threads=-2: must be an integer >= 1 \(torch threads\), or None"),
    ({"threads": 0}, r"threads=0: must be an integer >= 1"),
    ({"threads": 1.5}, r"threads=1.5: must be an integer >= 1"),
])
def test_llm_device_and_threads_are_one_value_error(tiny_ckpt, kwargs, message):
    before = torch.get_num_threads()
    with pytest.raises(ValueError, match=message):
        LLM(model=tiny_ckpt, **kwargs)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("kwargs,message", [
    ({"stop": 5}, r"stop=5: must be a string or a list of strings"),
    ({"stop": [5]}, r"stop=\[5\]: must be a list of non-empty strings"),
    ({"stop_token_ids": 5}, r"stop_token_ids=5: must be a list of token ids \(integers >= 0\), e.g."),
    ({"stop_token_ids": "5"}, r"stop_token_ids='5': must be a list of token ids"),
    ({"temperature": math.inf}, r"temperature=inf: must be a finite number >= 0"),
    ({"temperature": math.nan}, r"temperature=nan: must be a finite number >= 0"),
])
def test_sampling_params_type_errors_are_one_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_stop_token_ids_keep_a_tuple_or_set_as_a_list():
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]
    assert SamplingParams(stop_token_ids={7}).stop_token_ids == [7]


@pytest.mark.parametrize("sampling_params,message", [
    ({"max_tokens": 4}, r"sampling_params=\{'max_tokens': 4\} is a dict: pass SamplingParams\(\*\*"),
    (4, r"sampling_params of type int: pass a SamplingParams or a list of them"),
    ([SamplingParams(), {"max_tokens": 4}], r"sampling_params of type list: pass a SamplingParams"),
    ([SamplingParams()] * 3, r"2 prompts but 3 SamplingParams"),
])
def test_generate_refuses_what_is_not_sampling_params(llm, sampling_params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["a", "b"], sampling_params)


def test_a_stop_token_id_outside_the_vocabulary_fails_its_request_with_one_line(llm):
    vocab = llm.model.cfg.vocab_size
    bad, good = llm.generate(["x", "y"], [SamplingParams(max_tokens=2, stop_token_ids=[vocab]),
                                          SamplingParams(max_tokens=2)])
    assert bad.error == f"stop_token_ids token ids [{vocab}] are outside the vocabulary [0, {vocab})"
    assert bad.output_token_ids == [] and good.error is None and len(good.output_token_ids) == 2


def test_the_server_answers_a_stop_token_id_outside_the_vocabulary_with_a_400(llm):
    pytest.importorskip("uvicorn")
    from fastapi.testclient import TestClient
    from mtpx.serve.app import build_app
    vocab = llm.model.cfg.vocab_size
    with TestClient(build_app(llm, "tiny")) as client:
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stop_token_ids": [vocab]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "stop_token_ids"
    assert "outside the vocabulary" in r.json()["error"]["message"]
