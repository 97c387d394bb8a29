"""The benchmark client over HTTP: the traffic of `mode=bench` (prompts, max concurrency, Poisson
arrivals) sent to any OpenAI-compatible server (mtpx's `mode=serve`, `vllm serve`, SGLang), timed
from the stream as vLLM's `bench serve` times it.

The API key of a server that asks for one (mtpx's serve.api_key, vLLM's --api-key) is read from
MTPX_API_KEY, else OPENAI_API_KEY (API_KEY_VARS). Each request is one streamed
`POST {base_url}/completions` with `stream_options.include_usage` and `return_token_ids` (vLLM's
extension; mtpx's server answers it too). TTFT is the arrival of
the first chunk with text, each later chunk with text is one emission (ITL), E2EL ends at the last
chunk. Output token ids come from `token_ids` when the server returns them; otherwise the count
of the usage chunk stands in for them (ids of -1). The spec-decode counters come from the
response's `spec_decode` field when the server sends one (mtpx); other servers' runs report no
acceptance. A request that fails (HTTP error, dropped connection) carries the error; the others go on.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mtpx.outputs import RequestOutput, SpecDecodeCounts


@dataclass
class HttpSampling:
    """What one request asks for (the fields of SamplingParams the client sends)."""
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False


def run_http_client(base_url: str, model: str | None, prompts: Sequence[str | list[int]],
                    params: Sequence[HttpSampling], max_concurrency: int | None = None,
                    arrival_offsets: Sequence[float] | None = None,
                    timeout_s: float = 600.0) -> list[RequestOutput]:
    """Send every prompt (text or token ids) to base_url (".../v1") and return one RequestOutput
    per prompt, in order. model None: the first id of GET /models. Raises ValueError (one line)
    when the server cannot be reached or lists no model."""
    return asyncio.run(_run(base_url.rstrip("/"), model, list(prompts), list(params), max_concurrency,
                            arrival_offsets, timeout_s))


API_KEY_VARS = ("MTPX_API_KEY", "OPENAI_API_KEY")
"""Where the client's API key comes from, first set wins (mtpx's serve.api_key variable, then the
one vLLM's `bench serve` and the openai SDK read); sent as `Authorization: Bearer <key>`."""


def api_key_headers() -> dict[str, str]:
    key = next((os.environ[v] for v in API_KEY_VARS if os.environ.get(v)), None)
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _run(base_url, model, prompts, params, max_concurrency, arrival_offsets, timeout_s):
    import httpx

    limits = httpx.Limits(max_connections=max_concurrency or len(prompts) or 1)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, headers=api_key_headers()) as client:
        if model is None:
            try:
                listed = await client.get(f"{base_url}/models")
                if listed.status_code == 401:
                    raise ValueError(f"bench.base_url={base_url}: the server asks for an API key (401): set "
                                     "MTPX_API_KEY (or OPENAI_API_KEY) to its serve.api_key")
                listed = listed.json()["data"]
            except (httpx.HTTPError, KeyError, TypeError, json.JSONDecodeError) as e:
                raise ValueError(f"bench.base_url={base_url}: GET /models failed ({e}): "
                                 "is the server up?") from None
            if not listed:
                raise ValueError(f"bench.base_url={base_url}: the server lists no model")
            model = listed[0]["id"]
        gate = asyncio.Semaphore(max_concurrency or len(prompts) or 1)
        start = time.perf_counter()

        async def one(i: int) -> RequestOutput:
            if arrival_offsets is not None:
                await asyncio.sleep(max(0.0, start + arrival_offsets[i] - time.perf_counter()))
            async with gate:
                return await _request(client, base_url, model, i, prompts[i], params[i])

        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))


async def _request(client, base_url: str, model: str, index: int, prompt, p: HttpSampling) -> RequestOutput:
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": p.max_tokens, "temperature": p.temperature,
            "top_p": p.top_p, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    for key, value, default in (("top_k", p.top_k, -1), ("min_p", p.min_p, 0.0), ("seed", p.seed, None),
                                ("ignore_eos", p.ignore_eos, False)):
        if value != default:                         # vLLM's extensions, only when set
            body[key] = value
    out = RequestOutput(index=index, prompt_token_ids=list(prompt) if isinstance(prompt, list) else [],
                        output_token_ids=[], text="", finish_reason=None, spec=SpecDecodeCounts(),
                        arrival_time=time.perf_counter(), first_token_time=None, finish_time=None,
                        prompt=prompt if isinstance(prompt, str) else None)
    texts, ids, usage = [], [], None
    try:
        async with client.stream("POST", f"{base_url}/completions", json=body) as r:
            if r.status_code != 200:
                detail = (await r.aread()).decode(errors="replace")
                try:
                    detail = json.loads(detail)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    pass
                out.error = f"HTTP {r.status_code}: {detail}"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = chunk["error"].get("message", "server error")
                    break
                now = time.perf_counter()
                usage = chunk.get("usage") or usage
                for c in chunk.get("choices") or []:
                    if c.get("text"):
                        texts.append(c["text"])
                        out.first_token_time = out.first_token_time or now
                        out.emission_times.append(now)
                    ids += c.get("token_ids") or []
                    out.finish_reason = c.get("finish_reason") or out.finish_reason
                if chunk.get("spec_decode"):
                    out.spec = _spec(chunk["spec_decode"])
                out.finish_time = now
    except httpx.HTTPError as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    out.text = "".join(texts)
    n = (usage or {}).get("completion_tokens")
    out.output_token_ids = ids if ids or n is None else [-1] * n
    if not out.prompt_token_ids and usage:
        out.prompt_token_ids = [-1] * usage.get("prompt_tokens", 0)
    return out


def _spec(d: dict) -> SpecDecodeCounts:
    """A response's spec_decode field (mtpx/serve/responses.py) as counters."""
    return SpecDecodeCounts(num_drafts=d["num_drafts"], num_draft_tokens=d["num_draft_tokens"],
                            num_accepted_tokens=d["num_accepted_tokens"],
                            accepted_per_position=list(d["accepted_per_position"]),
                            num_committed_tokens=d.get("num_committed_tokens", 0))
