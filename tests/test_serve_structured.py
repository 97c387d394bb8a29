"""Structured output through mode=serve (docs/structured_output.md): the openai SDK's
`chat.completions.parse` with a Pydantic model, `tools` with a named and a "required"
tool_choice, vLLM's guided_* and structured_outputs fields and response_format on both routes,
streamed and not, against a live server; bad constraints are a 400 naming the field."""
import json
import re

import httpx
import pytest
from pydantic import BaseModel, Field

from mtpx import LLM
from tests.test_serve import running
from tests.test_serve_clients import chat_ckpt  # noqa: F401 - the fixture

openai = pytest.importorskip("openai")
from mtpx.serve.app import build_app  # noqa: E402

MESSAGES = [{"role": "user", "content": "def f(x):"}]


class Point(BaseModel):
    label: str = Field(max_length=5)
    x: int = Field(ge=-9, le=99)
    ok: bool


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def live(chat_ckpt):  # noqa: F811
    yield from running(build_app(LLM(model=chat_ckpt, spec="mtp8", num_speculative_tokens=3, max_num_seqs=8),
                                 "tiny"))


@pytest.fixture(scope="module")
def client(live):
    url, _ = live
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=60, max_retries=0)


def test_openai_parse_with_a_pydantic_model(client):
    for seed in range(3):
        out = client.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Point,
                                            max_tokens=120, temperature=1.0, seed=seed)
        p = out.choices[0].message.parsed
        assert isinstance(p, Point) and len(p.label) <= 5 and -9 <= p.x <= 99, out


def test_tools_with_named_and_required_tool_choice(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER, TIME],
                                         max_tokens=120, tool_choice=named)
    msg = out.choices[0].message
    (call,) = msg.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and msg.content is None
    assert set(args) == {"city", "days"} and 1 <= args["days"] <= 7
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER, TIME],
                                         max_tokens=200, tool_choice="required")
    calls = out.choices[0].message.tool_calls
    assert len(calls) == 1 and out.choices[0].finish_reason == "tool_calls"    # parallel_tool_calls unset
    for c in calls:
        assert c.function.name in ("get_weather", "get_time")
        assert isinstance(json.loads(c.function.arguments), dict)
    # tool_choice "auto" (no tool parser for the demo's template): plain text content
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER], max_tokens=4)
    assert out.choices[0].message.tool_calls in (None, []) and out.choices[0].message.content is not None


def _calls(entries) -> dict:
    """{index: (name, parsed arguments)} from streamed tool_calls entries (dicts)."""
    names, args = {}, {}
    for e in entries:
        if e.get("id"):
            names[e["index"]] = e["function"]["name"]
        args[e["index"]] = args.get(e["index"], "") + (e["function"].get("arguments") or "")
    return {i: (names[i], json.loads(args[i])) for i in names}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_streamed_tool_calls(client, live, tool_choice):
    """stream=true with a tool-call constraint: OpenAI's delta.tool_calls (vLLM's shape), the
    first delta of a call with id, type and function.name, later ones function.arguments pieces,
    equal to the non-streamed calls; through the openai SDK's typed chunks and raw SSE."""
    kw = dict(model="tiny", messages=MESSAGES, tools=[WEATHER, TIME], max_tokens=200, tool_choice=tool_choice,
              temperature=0)
    plain = client.chat.completions.create(**kw).choices[0]
    want = {i: (c.function.name, json.loads(c.function.arguments))
            for i, c in enumerate(plain.message.tool_calls)}
    assert want
    entries, finish = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            entries += [e.model_dump() for e in ch.delta.tool_calls or []]
            assert not ch.delta.content
            finish += [ch.finish_reason] if ch.finish_reason else []
    assert _calls(entries) == want and finish == [plain.finish_reason]
    assert finish == ["tool_calls" if tool_choice == "required" else "stop"]
    url, _ = live
    r = httpx.post(f"{url}/v1/chat/completions", json={**kw, "stream": True}, timeout=120)
    chunks = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
    entries = [e for c in chunks for ch in c["choices"] for e in ch["delta"].get("tool_calls", [])]
    assert _calls(entries) == want and r.text.rstrip().endswith("data: [DONE]")
    heads = [e for e in entries if "id" in e]
    assert [h["function"] for h in heads] == [{"name": n, "arguments": ""} for n, _ in want.values()]
    assert all(h["type"] == "function" and h["id"].startswith("chatcmpl-tool-") for h in heads)
    pieces = [e for e in entries if "id" not in e]
    assert len(pieces) > 1 and all(set(e) == {"index", "function"} and set(e["function"]) == {"arguments"}
                                   for e in pieces)


FIELDS = [  # (request fields, check of the output text)
    ({"guided_regex": "[a-z]{2,5}-[0-9]{1,3}"}, lambda t: re.fullmatch("[a-z]{2,5}-[0-9]{1,3}", t)),
    ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 50, "minimum": 0}},
                      "required": ["n"]}}, lambda t: 0 <= json.loads(t)["n"] <= 50),
    ({"guided_grammar": 'root ::= "x" [0-9]{1,2}'}, lambda t: re.fullmatch("x[0-9]{1,2}", t)),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}}}},
     lambda t: isinstance(json.loads(t)["b"], bool)),
]


@pytest.mark.parametrize("stream", [False, True])
def test_guided_fields_on_both_routes(live, stream):
    url, _ = live
    for fields, ok in FIELDS:
        for route, body in (("/v1/completions", {"prompt": "def f(x):"}), ("/v1/chat/completions",
                                                                           {"messages": MESSAGES})):
            r = httpx.post(f"{url}{route}", json={**body, **fields, "max_tokens": 80, "stream": stream},
                           timeout=60)
            assert r.status_code == 200, r.text
            if stream:
                events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
                text = "".join(e["choices"][0].get("text") or e["choices"][0].get("delta", {}).get("content")
                               or "" for e in events if e["choices"])
            else:
                c = r.json()["choices"][0]
                text = c.get("text", c.get("message", {}).get("content"))
            assert ok(text), (route, fields, text)


BAD = [
    ({"guided_regex": "[a-"}, "guided_regex", "Unclosed"),
    ({"guided_json": {"type": "objectx"}}, "guided_json", "Unsupported type"),
    ({"guided_grammar": "root ::= foo"}, "guided_grammar", "not defined"),
    ({"guided_regex": "[^\\s\\S]"}, "guided_regex", "no token of the tokenizer's vocabulary can start"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format", "Unsupported type"),
    ({"response_format": {"type": "xml"}}, "response_format", "must be"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice", "only one constraint"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs",
     "only one constraint"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"allowed_token_ids": [99999]}, "allowed_token_ids", "outside the vocabulary"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not in tools"),
]


@pytest.mark.parametrize("fields,param,message", BAD)
def test_bad_constraints_are_one_400_naming_the_field(live, fields, param, message):
    url, _ = live
    route, body = (("/v1/chat/completions", {"messages": MESSAGES}) if "tools" in fields
                   else ("/v1/completions", {"prompt": "x"}))
    r = httpx.post(f"{url}{route}", json={**body, **fields, "max_tokens": 4}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"] and "\n" not in err["message"], err
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200
