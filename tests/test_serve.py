"""mode=serve driven by real clients: the official `openai` package (streaming and not) gets the
text and token counts of LLM.generate; concurrent streaming clients that disconnect leave no KV
blocks or batch slots behind; /metrics parses with the Prometheus parser and its counters are the
sums of the responses' spec-decode stats; bad requests get one 400 naming the field."""
import json
import socket
import threading
import time

import httpx
import pytest

from mtpx import LLM, SamplingParams

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

PROMPTS = ["def f(x):", "Question: what?\nAnswer:", "    return x + 1\n", "class A:"]



def _wait_healthy(proc, url: str, limit_s: float = 120) -> None:
    """Until a server subprocess answers GET url/health with 200 (its stderr if it exits first)."""
    t0 = time.time()
    while True:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.time() - t0 < limit_s
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_ckpt):
    from mtpx.serve.app import build_app
    llm = LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2, max_num_seqs=8)
    yield from running(build_app(llm, "tiny"))


def running(app):
    """Serve `app` with uvicorn on a free local port in a thread; yields (base url, app) and
    stops the server afterwards (a fixture's body)."""
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    t0 = time.time()
    while not srv.started:
        assert time.time() - t0 < 60 and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", app
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def reference(tiny_ckpt):
    """Plain decoding of PROMPTS in process (greedy): what every server response must equal."""
    llm = LLM(model=tiny_ckpt)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12))
    return {p: o for p, o in zip(PROMPTS, outs)}


def test_openai_client_gets_what_generate_gives(server, reference):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    assert [m.id for m in client.models.list().data] == ["tiny"]
    for p in PROMPTS:
        r = client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0)
        ref = reference[p]
        assert r.choices[0].text == ref.text and r.choices[0].finish_reason == ref.finish_reason
        assert r.usage.completion_tokens == len(ref.output_token_ids)
        assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
        assert r.model_extra["spec_decode"]["num_drafts"] >= 1
        chunks = list(client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
        assert chunks[-1].usage.completion_tokens == len(ref.output_token_ids)
    ids = reference[PROMPTS[0]].prompt_token_ids
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0)
    assert r.choices[0].text == reference[PROMPTS[0]].text
    batch = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0)
    assert [c.text for c in batch.choices] == [reference[p].text for p in PROMPTS]


def test_bad_requests_get_one_400_naming_the_field(server):
    url, _ = server
    cases = [
        (b"{not json", None, "malformed JSON"),
        ({"prompt": 5, "max_tokens": 3}, "prompt", "prompt"),
        ({"prompt": "hi", "max_tokens": "many"}, "max_tokens", "max_tokens"),
        ({"prompt": "hi", "promt": "x"}, "promt", "unknown field 'promt'"),
        ({"prompt": ""}, "prompt", "empty prompt"),
        ({"prompt": "hi", "max_tokens": 100000}, "max_tokens", "exceeds the model's maximum length"),
        ({"prompt": "hi", "n": 0}, "n", "n"),
        ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty", "must be in [-2, 2]"),
        ({"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias", "is not a token id"),
        ({"prompt": "hi", "logit_bias": {"99999": 1}}, "logit_bias", "outside the vocabulary"),
        ({"prompt": "hi", "max_tokens": 2, "min_tokens": 3}, "min_tokens", "max_tokens=2"),
        ({"prompt": "hi", "echo": True, "logprobs": 1, "stream": True}, "stream", "prompt scoring"),
    ]
    for body, param, message in cases:
        r = httpx.post(f"{url}/v1/completions", content=body if isinstance(body, bytes) else json.dumps(body),
                       headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert message in err["message"] and err["param"] == param and "\n" not in err["message"], (body, err)
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                   timeout=30)
    assert r.status_code == 400 and "has no chat template" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "logprobs": True}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


def test_tokenize_detokenize_health(server, reference):
    url, _ = server
    assert httpx.get(f"{url}/health").status_code == 200
    ids = reference[PROMPTS[0]].prompt_token_ids
    r = httpx.post(f"{url}/tokenize", json={"prompt": PROMPTS[0]}).json()
    assert r["tokens"] == ids and r["count"] == len(ids)
    assert httpx.post(f"{url}/detokenize", json={"tokens": ids}).json()["prompt"] == PROMPTS[0]


def test_disconnecting_stream_clients_leave_nothing_behind(server, reference):
    """64 concurrent streaming clients, a quarter of them hanging up after their first chunk:
    the survivors get plain decoding's text and no KV block or batch slot stays held."""
    url, app = server
    texts, errors = {}, []

    def client(i: int) -> None:
        p = PROMPTS[i % len(PROMPTS)]
        body = {"prompt": p, "max_tokens": 12 if i % 4 else 200, "temperature": 0, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                got = []
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    got.append(json.loads(line[6:])["choices"][0]["text"])
                    if i % 4 == 0:
                        return                          # hang up mid-stream
                texts[i] = "".join(got)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert {i: texts[i] for i in texts} == {i: reference[PROMPTS[i % len(PROMPTS)]].text
                                            for i in range(64) if i % 4}
    engine = app.state.engine
    t0 = time.time()
    while engine.stats["num_running"] or engine.stats["num_waiting"]:
        assert time.time() - t0 < 60
        time.sleep(0.05)
    stats = engine.stats
    assert stats["num_free_kv_blocks"] == stats["num_kv_blocks"] and stats["num_batch_slots_in_use"] == 0


def test_metrics_are_the_sums_of_the_responses(tiny_ckpt):
    """A fresh server: /metrics parses, and its spec-decode counters equal the sums of the
    spec_decode fields of the responses it sent."""
    from prometheus_client.parser import text_string_to_metric_families

    from mtpx.serve.app import build_app
    app = build_app(LLM(model=tiny_ckpt, spec="mtp8", num_speculative_tokens=2), "tiny")
    from fastapi.testclient import TestClient
    with TestClient(app) as c:
        stats = [c.post("/v1/completions",
                        json={"prompt": p, "max_tokens": 10, "temperature": 0}).json()["spec_decode"]
                 for p in PROMPTS]
        text = c.get("/metrics").text
    values = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert values[("mtpx:spec_decode_num_drafts_total", ())] == sum(s["num_drafts"] for s in stats)
    assert (values[("mtpx:spec_decode_num_draft_tokens_total", ())]
            == sum(s["num_draft_tokens"] for s in stats))
    assert (values[("mtpx:spec_decode_num_accepted_tokens_total", ())]
            == sum(s["num_accepted_tokens"] for s in stats))
    for pos in range(2):
        assert values[("mtpx:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(pos)),))] == \
            sum(s["accepted_per_position"][pos] for s in stats)
    assert values[("mtpx:request_success_total", (("finished_reason", "length"),))] + \
        values.get(("mtpx:request_success_total", (("finished_reason", "stop"),)), 0) == len(PROMPTS)
    assert values[("mtpx:num_requests_running", ())] == 0 and values[("mtpx:num_speculative_tokens", ())] == 2


def test_mode_serve_from_the_command_line(tiny_ckpt, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(root / "train_or_eval.py"), "mode=serve",
                             f"serve.port={port}", f"model.path={tiny_ckpt}", "+spec=mtp8",
                             "spec.num_speculative_tokens=2", "logger=none", f"hydra.run.dir={tmp_path}"],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}")
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"model": tiny_ckpt.name, "prompt": "def f(x):", "max_tokens": 4,
                             "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert f"serving {tiny_ckpt.name} (mtp8 k=2) at http://127.0.0.1:{port}/v1" in out


def test_chat_completions_through_the_chat_template(tiny_ckpt, tmp_path):
    """A checkpoint with a chat template: the reply (streamed or not) is what LLM.generate gives
    for the rendered prompt's ids."""
    import shutil

    from fastapi.testclient import TestClient

    from mtpx.serve.app import build_app
    from tests.test_hf_tokenizer import CHATML
    ckpt = tmp_path / "chat"
    shutil.copytree(tiny_ckpt, ckpt)
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                            "chat_template": CHATML}))
    plain = LLM(model=ckpt)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is x?"}]
    rendered = plain.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = plain.tokenizer.encode(rendered, add_special_tokens=False).ids
    (ref,) = plain.generate([ids], SamplingParams(max_tokens=8))
    with TestClient(build_app(LLM(model=ckpt, spec="mtp8", num_speculative_tokens=2), "chat")) as c:
        r = c.post("/v1/chat/completions",
                   json={"messages": messages, "max_tokens": 8, "temperature": 0}).json()
        assert r["choices"][0]["message"] == {"role": "assistant", "content": ref.text}
        assert r["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(ref.output_token_ids),
                              "total_tokens": len(ids) + len(ref.output_token_ids)}
        lines = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "temperature": 0,
                                                     "stream": True}).text.strip().split("\n\n")
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == ref.text
        assert c.post("/tokenize", json={"messages": messages}).json()["tokens"] == ids


def test_bench_over_http_reports_the_same_table(server, tiny_ckpt, tmp_path):
    """mode=bench bench.base_url=...: the same prompts sent to the server; its greedy outputs are
    the in-process ones, token counts come back exactly (return_token_ids) and the spec-decode
    counters are the server's."""
    from hydra import compose, initialize_config_dir

    from mtpx.evaluate import run_bench
    from tests.test_cli import CONF
    url, _ = server
    common = ["mode=bench", "logger=none", f"model.path={tiny_ckpt}", "bench.num_prompts=6",
              "bench.max_tokens=10", "bench.concurrency=3"]
    with initialize_config_dir(config_dir=CONF, version_base=None):
        http_cfg = compose("config", overrides=common + [f"bench.base_url={url}/v1"])
        local_cfg = compose("config", overrides=common)
    assert run_bench(http_cfg, tmp_path / "http") == 0
    assert run_bench(local_cfg, tmp_path / "local") == 0
    http_rows, local_rows = ([json.loads(line) for line in open(tmp_path / d / "outputs.jsonl")]
                             for d in ("http", "local"))
    http_metrics = json.load(open(tmp_path / "http" / "metrics.json"))
    assert [r["output_token_ids"] for r in http_rows] == [r["output_token_ids"] for r in local_rows]
    assert [r["text"] for r in http_rows] == [r["text"] for r in local_rows]
    assert http_metrics["num_requests"] == 6 and http_metrics["num_failed"] == 0
    assert http_metrics["num_drafts"] > 0 and http_metrics["run"]["base_url"] == f"{url}/v1"
    assert http_metrics["mean_ttft_ms"] > 0 and http_metrics["output_throughput"] > 0


def test_echo_logprobs_score_the_prompt_as_lm_eval_asks(server, tiny_ckpt):
    """lm-eval's loglikelihood request (token ids, echo, logprobs=1, max_tokens=1): the prompt's
    token_logprobs equal LLM.generate's prompt_logprobs, and the greedy check lm-eval makes
    (each token's logprob is the top one) can be computed from top_logprobs."""
    url, _ = server
    plain = LLM(model=tiny_ckpt)
    ids = plain.encode("Question: what?\nAnswer: 42")
    (ref,) = plain.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=1))
    r = httpx.post(f"{url}/v1/completions",
                   json={"model": "tiny", "prompt": ids, "max_tokens": 1, "logprobs": 1,
                         "echo": True, "temperature": 0}, timeout=60).json()
    lp = r["choices"][0]["logprobs"]
    assert (len(lp["tokens"]) == len(ids) + 1 and lp["token_logprobs"][0] is None
            and lp["top_logprobs"][0] is None)
    for i in range(1, len(ids)):
        assert abs(lp["token_logprobs"][i] - ref.prompt_logprobs[i][ids[i]].logprob) < 1e-4
        greedy = ref.prompt_logprobs[i][ids[i]].rank == 1
        assert (lp["token_logprobs"][i] >= max(lp["top_logprobs"][i].values()) - 1e-9) == greedy
    assert r["choices"][0]["text"].startswith(plain.decode(ids))


def test_sigterm_under_load_exits_0_within_shutdown_timeout(tiny_ckpt, tmp_path):
    """SIGTERM with requests in flight: a short one drains to its end, the long ones are aborted
    when serve.shutdown_timeout runs out: their streams end cleanly (a last chunk with
    finish_reason "abort", then [DONE]) and a non-streamed one gets its response with
    finish_reason "abort"; no traceback in the log; the process exits 0 within the timeout plus
    5 s (an engine step, the last chunks and teardown)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    port, timeout = _free_port(), 3
    proc = subprocess.Popen([sys.executable, str(root / "train_or_eval.py"), "mode=serve",
                             f"serve.port={port}", f"model.path={tiny_ckpt}", "+spec=mtp8",
                             "spec.num_speculative_tokens=2", "logger=none",
                             f"serve.shutdown_timeout={timeout}", "engine.compile=false",
                             f"hydra.run.dir={tmp_path}"], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    streams: dict[int, list] = {}

    def stream(i: int, max_tokens: int):
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True}
        streams[i] = []
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        streams[i].append(line[len("data: "):])
        except httpx.HTTPError as e:
            streams[i].append(f"error: {type(e).__name__}")

    whole = []

    def post():
        body = {"prompt": PROMPTS[0], "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
        try:
            whole.append(httpx.post(f"{url}/v1/completions", json=body, timeout=120))
        except httpx.HTTPError as e:
            whole.append(e)

    try:
        _wait_healthy(proc, url)
        t0 = time.time()
        threads = [threading.Thread(target=stream, args=(i, 1000)) for i in range(4)]
        threads.append(threading.Thread(target=stream, args=(4, 12)))
        threads.append(threading.Thread(target=post))
        for t in threads:
            t.start()
        while len(streams) < 5 or any(len(c) < 2 for i, c in streams.items() if i < 4):
            assert time.time() - t0 < 120
            time.sleep(0.02)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        elapsed = time.time() - sent
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    print(f"SIGTERM under load to exit: {elapsed:.2f} s (serve.shutdown_timeout={timeout})")
    assert elapsed < timeout + 8, elapsed       # 4.1-4.8 s on 2 loaded cores; 9.4 s beside 8 busy processes
    assert "server stopped" in out
    assert (streams[4][-1] == "[DONE]"
            and json.loads(streams[4][-2])["choices"][0]["finish_reason"] == "length")
    for i in range(4):
        assert streams[i][-1] == "[DONE]" and len(streams[i]) < 1000, streams[i][-3:]
        last = json.loads(streams[i][-2])
        assert last["choices"][0]["finish_reason"] == "abort", last
    assert isinstance(whole[0], httpx.Response) and whole[0].status_code == 200, whole
    choice = whole[0].json()["choices"][0]
    assert choice["finish_reason"] == "abort" and whole[0].json()["usage"]["completion_tokens"] < 1000
    assert "Traceback" not in err and "Exception in ASGI" not in err, err[-3000:]


@pytest.mark.parametrize("override,message", [
    ("serve.shutdown_timeout=-1", "error: serve.shutdown_timeout=-1.0: must be seconds >= 0"),
    # the same check before loading, about 10 s
    pytest.param("serve.latency_buckets=[1,0.5]",
                 "error: serve.latency_buckets=[1.0, 0.5]: must be a non-empty increasing list",
                 marks=pytest.mark.slow),
])
def test_bad_serve_settings_are_one_line_before_loading(tiny_ckpt, tmp_path, override, message):
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "train_or_eval.py"), "mode=serve",
                        f"model.path={tiny_ckpt}", override, "logger=none", f"hydra.run.dir={tmp_path}"],
                       cwd=root, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       timeout=120)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "threads:" not in r.stdout                     # checked before the model was loaded
