"""The OpenAI-compatible HTTP API of `mode=serve` (FastAPI on uvicorn).

Routes: POST /v1/completions, POST /v1/chat/completions (through the model's chat template),
GET /v1/models, GET /health, POST /tokenize, POST /detokenize, GET /tokenizer_info (the
tokenizer_config.json of the served tokenizer, as vLLM's and lm-eval's remote tokenizer read it),
GET /metrics (Prometheus text).

Request bodies take every field of vLLM's OpenAI server (mtpx/serve/protocol.py): n > 1
(completion j seeded with seed + j, as LLM.generate), best_of = n, stream_options
(include_usage, continuous_usage_stats: usage in every chunk), skip_special_tokens,
include_stop_str_in_output, truncate_prompt_tokens, prompt_logprobs, add_special_tokens,
return_token_ids, return_tokens_as_token_ids, min_tokens, repetition_penalty, frequency_penalty,
presence_penalty and logit_bias (biases clamped to [-100, 100], as vLLM does); beam search,
guided decoding and the like only at their neutral values. An unknown field, a field of the wrong type or an
unsupported value, malformed JSON or a prompt the engine cannot run gets a 400 with an
OpenAI-style error body naming the field; a body over `max_body_bytes` a 413. Every response
carries `usage` and a `spec_decode` field (drafts, accepted, per position, acceptance length).

Streams are server-sent events: a chunk per engine step that produced text, then
`data: [DONE]`; their deltas concatenate to the non-streamed text (mtpx/serve/detokenize.py:
text that may still be a stop string is held back), each chunk carries the logprobs of its
tokens, echo rides on the first chunk, and several prompts or n > 1 interleave choices by index.
Tokenization and chat templates run off the event loop, and a text certainly longer than the
model (more bytes than 4 x the longest token's x max_model_len) is a 400 before tokenizing. A client that disconnects aborts its
requests, streamed or not.
`echo` with `logprobs` scores the prompt (lm-eval's loglikelihood requests): the logprobs cover
the prompt's tokens then the output's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mtpx.engine.llm import LLM
from mtpx.core.sampling_params import SamplingParams
from mtpx.hf.tokenizer import tokenizer_config
from mtpx.serve.async_engine import AsyncEngine, Update
from mtpx.serve.detokenize import IncrementalText, final_text
from mtpx.serve.metrics import ServerMetrics
from mtpx.serve.protocol import (ChatMessage, ChatRequest, CompletionRequest, DetokenizeRequest, SamplingFields,
                                 TokenizeRequest, unsupported_field)

DEFAULT_MAX_BODY_BYTES = 32 * 2**20
_TYPE_WORDS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "any"}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


class _ClientGone(Exception):
    """The client of a non-streamed request disconnected: its requests were aborted."""


def _error(message: str, param: str | None = None, status: int = 400) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


def spec_decode_stats(u: Update) -> dict[str, Any]:
    """The response's `spec_decode` field from a finished request's counters."""
    s = u.spec
    return {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens, "accepted_per_position": list(s.accepted_per_position),
            "num_committed_tokens": s.num_committed_tokens, "acceptance_length": s.acceptance_length}


@dataclasses.dataclass
class _Run:
    """One engine request of an HTTP request: choice `index`, prompt ids, its params, the text
    echoed before its output ("" without echo) and whether it is its prompt's first completion."""
    index: int
    ids: list[int]
    sp: SamplingParams
    echo: str = ""
    first_of_prompt: bool = True
    arrival_time: float | None = None     # perf_counter() when the HTTP request arrived


class BodyLimit:
    """ASGI middleware: reads each HTTP body whole, answering 413 (OpenAI error shape) once it
    passes `max_bytes`, then hands it to `app` (later receive() calls go to the client, so
    disconnects are still seen)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # TTFT and E2EL count from here, as a client sees them (body, parsing and tokenization included)
        scope.setdefault("state", {})["arrival_time"] = time.perf_counter()
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large(scope, receive, send)
            if not message.get("more_body"):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send):
        response = _error(f"request body is larger than the server's limit of {self.max_bytes} bytes "
                          "(serve.max_body_bytes): send a shorter prompt", None, 413)
        await response(scope, receive, send)


def build_app(llm: LLM, model_name: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              latency_buckets=None) -> FastAPI:
    """The FastAPI app serving `llm` under the model id `model_name`; request bodies over
    `max_body_bytes` get a 413; latency_buckets: the latency histograms' bounds in seconds (None:
    mtpx.serve.metrics.DEFAULT_LATENCY_BUCKETS). Its engine loop starts with the app (lifespan)
    and stops with it, after its current step."""
    from contextlib import asynccontextmanager

    metrics = ServerMetrics(llm.num_speculative_tokens, lambda: engine.stats, latency_buckets)
    engine = AsyncEngine(llm, on_finish=metrics.record)

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="mtpx", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.state.engine = engine
    tok = llm.tokenizer
    vocab_size = llm.model.cfg.vocab_size

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        # pydantic names the union member that failed (prompt.str, prompt.list[int]): not a field
        field_loc = [x for x in loc if x.isdigit() or (x.isidentifier() and x not in _TYPE_WORDS)]
        param = ".".join(field_loc) or None
        if err.get("type") == "json_invalid":
            why = (err.get("ctx") or {}).get("error")
            return _error(f"malformed JSON body: {why or err.get('msg')}", None)
        if not loc:                         # the body as a whole: empty, not an object, not JSON
            got = "an empty body" if err.get("type") == "missing" else f"{type(err.get('input')).__name__}"
            return _error(f"the request body must be a JSON object with content-type: application/json "
                          f"(got {got})", None)
        if err.get("type") == "extra_forbidden":
            return _error(f"unknown field '{param}'", param)
        if len(field_loc) < len(loc):
            return _error(f"{param}={err.get('input')!r}: wrong type for this field", param)
        return _error(f"{param}: {err.get('msg')}" if param else str(err.get("msg")), param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return _error(f"{exc.detail}: {request.method} {request.url.path}", None, exc.status_code)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest):
        return _error(exc.message, exc.param, exc.status)

    @app.exception_handler(_ClientGone)
    async def client_gone(request: Request, exc: _ClientGone):
        return Response(status_code=499)          # nginx's "client closed request": nobody reads it

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise BadRequest(f"model '{name}' is not served here: use '{model_name}' (GET /v1/models)", "model")

    # the most bytes of text one token stands for (special tokens included), for check_size
    max_token_bytes = 1 if tok is None else max(
        len(tok.decode([i], skip_special_tokens=False).encode("utf-8")) for i in range(tok.get_vocab_size()))

    def check_size(text: str, param: str) -> None:
        """A text with more UTF-8 bytes than 4 x max_token_bytes x max_model_len holds more tokens
        than the model takes (with 4x room for normalizers): a 400 at once, not after tokenizing
        megabytes."""
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise BadRequest(f"{param} is not valid Unicode text", param) from None
        if size > 4 * max_token_bytes * llm.max_model_len:
            raise BadRequest(f"{param} has {size} bytes of text, at least {size // (4 * max_token_bytes)} tokens, "
                             f"but the model's maximum length is {llm.max_model_len} (max_model_len): shorten it "
                             "(or set truncate_prompt_tokens)", param)

    def encode(text: str, param: str, add_special_tokens: bool = True, truncates: bool = False) -> list[int]:
        if tok is None:
            raise BadRequest("this model has no tokenizer: send token ids", param)
        if not truncates:
            check_size(text, param)          # also raises for text that is not valid Unicode
        else:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{param} is not valid Unicode text", param) from None
        if len(text) > 4096:    # encode_batch releases the GIL (encode does not): the event loop runs on
            return list(tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        return list(tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def chat_ids(messages: list[ChatMessage], add_generation_prompt: bool = True, add_special_tokens: bool = False,
                 chat_template: str | None = None, documents: list | None = None,
                 kwargs: dict | None = None, truncates: bool = False) -> list[int]:
        if tok is None or not hasattr(tok, "apply_chat_template") or (
                chat_template is None and getattr(tok, "chat_template", None) is None):
            raise BadRequest(f"model '{model_name}' has no chat template: use /v1/completions with a plain prompt "
                             "(or send chat_template)", "messages")
        try:
            rendered = tok.apply_chat_template([m.as_dict() for m in messages],
                                               add_generation_prompt=add_generation_prompt,
                                               chat_template=chat_template, documents=documents, **(kwargs or {}))
        except Exception as e:  # noqa: BLE001 - the template's own errors (raise_exception, bad roles)
            raise BadRequest(f"the chat template failed: {e}".replace("\n", " "), "messages") from None
        # the template holds the special tokens: encode without adding them (as transformers does)
        return encode(rendered, "messages", add_special_tokens, truncates)

    def check_fields(body: SamplingFields) -> None:
        check_model(body.model)
        bad = unsupported_field(body)
        if bad:
            raise BadRequest(*bad)

    def logit_bias(body: SamplingFields) -> dict[int, float] | None:
        """OpenAI's logit_bias ({"token id": bias}) as token ids, biases clamped to [-100, 100]."""
        if not body.logit_bias:
            return None
        bad = [k for k in body.logit_bias if not k.strip().isdigit()]
        if bad:
            raise BadRequest(f"logit_bias key {bad[0]!r} is not a token id: keys are token ids such as "
                             "\"50256\" (POST /tokenize gives them)", "logit_bias")
        return {int(k): min(100.0, max(-100.0, v)) for k, v in body.logit_bias.items()}

    def sampling(body: SamplingFields, max_tokens: int, logprobs: int | None) -> SamplingParams:
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=_or(body.temperature, 1.0),
                                  top_p=_or(body.top_p, 1.0), top_k=_or(body.top_k, -1), min_p=_or(body.min_p, 0.0),
                                  seed=body.seed, stop=body.stop, stop_token_ids=list(body.stop_token_ids or []),
                                  ignore_eos=body.ignore_eos, logprobs=logprobs,
                                  min_tokens=body.min_tokens,
                                  repetition_penalty=_or(body.repetition_penalty, 1.0),
                                  frequency_penalty=_or(body.frequency_penalty, 0.0),
                                  presence_penalty=_or(body.presence_penalty, 0.0), logit_bias=logit_bias(body))
        except ValueError as e:
            message = str(e)
            raise BadRequest(message, message.split("=", 1)[0] if "=" in message.split(":")[0] else None) from None

    def check_fits(ids: list[int], sp: SamplingParams, param: str) -> None:
        error = llm.engine.validate_prompt(ids)
        if error:
            raise BadRequest(error, param)
        error = llm.engine.validate_params(sp)
        if error:
            raise BadRequest(error, "logit_bias")
        if len(ids) + sp.max_tokens > llm.max_model_len:
            raise BadRequest(f"max_tokens={sp.max_tokens} with a {len(ids)}-token prompt exceeds the model's "
                             f"maximum length {llm.max_model_len}: lower max_tokens", "max_tokens")

    def runs_for(prompts_ids: list[list[int]], echoes: list[str], sp: SamplingParams, body: SamplingFields,
                 param: str) -> list[_Run]:
        """The engine requests of n completions per prompt, choice index prompt * n + j."""
        runs = []
        for i, (ids, echo) in enumerate(zip(prompts_ids, echoes)):
            if body.truncate_prompt_tokens is not None:
                ids = ids[-body.truncate_prompt_tokens:]
            check_fits(ids, sp, param)
            for j in range(body.n):
                child = sp if j == 0 or sp.seed is None else dataclasses.replace(sp, seed=sp.seed + j)
                runs.append(_Run(i * body.n + j, ids, child, echo, j == 0))
        return runs

    def arrived(runs: list[_Run], request: Request) -> None:
        for run in runs:
            run.arrival_time = getattr(request.state, "arrival_time", None)

    def output_text(run: _Run, u: Update, body: SamplingFields) -> str:
        """All output tokens decoded so far; without skip_special_tokens a finishing stop token
        (EOS, stop_token_ids) is left out of the text, as vLLM does."""
        ids = u.token_ids
        if body.skip_special_tokens:
            return llm.decode(ids)
        if u.finished and u.finish_reason == "stop" and not isinstance(u.stop_reason, str):
            ids = ids[:-1]
        return "" if tok is None else tok.decode(list(ids), skip_special_tokens=False)

    def token_str(t: int, as_ids: bool) -> str:
        return f"token_id:{t}" if as_ids else llm.decode([t])

    def logprobs_block(ids: list[int], entries: list, offset: int, as_ids: bool) -> dict:
        """OpenAI's completion logprobs of tokens `ids` with their entries (None: the first prompt
        token): tokens, token_logprobs, top_logprobs (the token and the top N, by text),
        text_offset (characters, from `offset`)."""
        tokens = [token_str(t, as_ids) for t in ids]
        token_lps, tops = [], []
        for t, e in zip(ids, entries):
            if e is None:
                token_lps.append(None)
                tops.append(None)
                continue
            lp, _, top = e
            token_lps.append(lp)
            tops.append({token_str(i, as_ids): v for i, v in top} | {token_str(t, as_ids): lp})
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    def prompt_logprobs_list(ids: list[int], scored: dict) -> list:
        """vLLM's prompt_logprobs: None for the first token, then {token id: {logprob, rank,
        decoded_token}} with the top tokens and the prompt token."""
        out: list = [None]
        for i in range(1, len(ids)):
            e = scored.get(i)
            if e is None:
                out.append(None)
                continue
            lp, rank, top = e
            d = {str(t): {"logprob": v, "rank": j + 1, "decoded_token": llm.decode([t])} for j, (t, v) in enumerate(top)}
            d[str(ids[i])] = {"logprob": lp, "rank": rank, "decoded_token": llm.decode([ids[i]])}
            out.append(d)
        return out

    def usage(prompt_len: int, completion_len: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_len, "completion_tokens": completion_len,
                "total_tokens": prompt_len + completion_len}

    def total_usage(runs: list[_Run], updates: list[Update]) -> dict[str, int]:
        return usage(sum(len(r.ids) for r in runs if r.first_of_prompt), sum(len(u.token_ids) for u in updates))

    async def run_one(run: _Run) -> Update:
        last = None
        try:
            async for u in engine.generate(run.ids, run.sp, run.arrival_time):
                last = u
        except ValueError as e:
            raise BadRequest(str(e), "prompt") from None
        if last.error:
            raise BadRequest(last.error)
        return last

    async def run_all(request: Request, runs: list[_Run]) -> list[Update]:
        """Every run to its end; a client that disconnects first aborts them all (_ClientGone) at
        once: its http.disconnect is awaited, not polled, so the engine runs at most the step in
        progress for it."""
        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        task = asyncio.ensure_future(asyncio.gather(*(run_one(r) for r in runs)))
        gone = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            raise _ClientGone()
        finally:
            for t in (task, gone):
                if not t.done():
                    t.cancel()
            await asyncio.gather(task, gone, return_exceptions=True)

    async def stream_updates(run: _Run, body: SamplingFields) -> AsyncIterator[tuple]:
        """(text delta, token ids, logprob entries, update) per engine update of `run` that has
        text to send or finishes; tokens whose text is held back ride on the next one. A failed
        request ends it as (None, [], None, update)."""
        text = IncrementalText(run.sp.stop, body.include_stop_str_in_output)
        sent_ids = 0
        async for u in engine.generate(run.ids, run.sp, run.arrival_time):
            if u.error:
                yield None, [], None, u
                return
            delta = text.delta(output_text(run, u, body), u.finished, u.stop_reason)
            if delta or u.finished:
                lps = u.logprobs[sent_ids:] if u.logprobs is not None else None
                yield delta, u.token_ids[sent_ids:], lps, u
                sent_ids = len(u.token_ids)

    async def merged(runs: list[_Run], body: SamplingFields) -> AsyncIterator[tuple[_Run, tuple]]:
        """stream_updates of every run, interleaved as they come; closing it aborts them all."""
        if len(runs) == 1:
            async for item in stream_updates(runs[0], body):
                yield runs[0], item
            return
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(run: _Run) -> None:
            try:
                async for item in stream_updates(run, body):
                    await queue.put((run, item))
            finally:
                queue.put_nowait((run, done))

        tasks = [asyncio.ensure_future(pump(r)) for r in runs]
        try:
            left = len(tasks)
            while left:
                run, item = await queue.get()
                if item is done:
                    left -= 1
                    continue
                yield run, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def stream_end(base: dict, body: SamplingFields, runs: list[_Run], last: dict[int, Update]) -> list[str]:
        """A stream's last events: the usage chunk (stream_options.include_usage), then [DONE]."""
        events = []
        so = body.stream_options
        if so is not None and so.include_usage and len(last) == len(runs) and not any(u.error for u in last.values()):
            events.append(_sse({**base, "choices": [], "usage": total_usage(runs, list(last.values()))}))
        return events + ["data: [DONE]\n\n"]

    def continuous_usage(body: SamplingFields) -> bool:
        so = body.stream_options
        return bool(so is not None and so.include_usage and so.continuous_usage_stats)

    # ---- routes ------------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "mtpx", "max_model_len": llm.max_model_len}]}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.exposition().decode(), media_type="text/plain; version=0.0.4")

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        if tok is None:
            raise BadRequest("this model has no tokenizer: send token ids", None, 404)
        info = tokenizer_config(tok)
        return info | {"model_max_length": llm.max_model_len, "vocab_size": tok.get_vocab_size(),
                       "eos_token_id": llm.eos_token_id}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise BadRequest("give exactly one of prompt or messages", "prompt")
        if body.continue_final_message:
            raise BadRequest("continue_final_message=True is not supported yet", "continue_final_message")
        if body.tools:
            raise BadRequest("tools are not supported yet (no tool calling): drop the field", "tools")
        if body.prompt is not None:
            special = True if body.add_special_tokens is None else body.add_special_tokens
            ids = await asyncio.to_thread(encode, body.prompt, "prompt", special)
        else:
            ids = await asyncio.to_thread(chat_ids, body.messages, body.add_generation_prompt,
                                          bool(body.add_special_tokens), body.chat_template, None,
                                          body.chat_template_kwargs)
        out = {"tokens": ids, "count": len(ids), "max_model_len": llm.max_model_len}
        if body.return_token_strs:
            out["token_strs"] = [tok.id_to_token(i) for i in ids]
        return out

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < vocab_size]
        if bad:
            raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})", "tokens")
        return {"prompt": llm.decode(body.tokens)}

    def prepare_completion(body: CompletionRequest) -> list[_Run]:
        """Tokenize and check a completion request (runs off the event loop)."""
        sp = sampling(body, body.max_tokens or 16, body.logprobs)   # OpenAI's default: 16 tokens
        if body.echo and body.logprobs is not None:    # prompt scoring (lm-eval's loglikelihood requests)
            sp = dataclasses.replace(sp, prompt_logprobs=body.logprobs)
        if body.prompt_logprobs is not None:
            sp = dataclasses.replace(sp, prompt_logprobs=max(body.prompt_logprobs, sp.prompt_logprobs or 0))
        prompts = body.prompt if isinstance(body.prompt, list) and body.prompt and not isinstance(
            body.prompt[0], int) else [body.prompt]
        if not prompts:
            raise BadRequest("prompt is empty: give at least one token", "prompt")
        truncates = body.truncate_prompt_tokens is not None
        all_ids = [encode(p, "prompt", body.add_special_tokens, truncates) if isinstance(p, str) else list(p)
                   for p in prompts]
        echoes = [(p if isinstance(p, str) else llm.decode(ids)) if body.echo else "" for p, ids in zip(prompts, all_ids)]
        return runs_for(all_ids, echoes, sp, body, "prompt")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_fields(body)
        if body.stream and body.echo and body.logprobs is not None:
            raise BadRequest("echo with logprobs (prompt scoring) is not streamed: set stream=false", "stream")
        if body.stream and body.prompt_logprobs is not None:
            raise BadRequest("prompt_logprobs are not streamed: set stream=false", "prompt_logprobs")
        runs = await asyncio.to_thread(prepare_completion, body)
        arrived(runs, request)
        rid = f"cmpl-{body.request_id or uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            return StreamingResponse(_stream_completions(rid, created, runs, body), media_type="text/event-stream")
        updates = await run_all(request, runs)
        choices = []
        for run, u in zip(runs, updates):
            text = final_text(output_text(run, u, body), u.stop_reason, body.include_stop_str_in_output)
            lp = None
            if u.logprobs is not None:
                entries, ids = list(u.logprobs), list(u.token_ids)
                if body.echo:
                    scored = u.prompt_logprobs or {}
                    entries = [None] + [scored.get(i) for i in range(1, len(run.ids))] + entries
                    ids = list(run.ids) + ids
                lp = logprobs_block(ids, entries, 0, bool(body.return_tokens_as_token_ids))
            choice = {"index": run.index, "text": run.echo + text, "logprobs": lp, "finish_reason": u.finish_reason,
                      "stop_reason": u.stop_reason, "spec_decode": spec_decode_stats(u)}
            if body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_list(run.ids, u.prompt_logprobs or {})
            if body.return_token_ids:
                choice |= {"prompt_token_ids": run.ids, "token_ids": u.token_ids}
            choices.append(choice)
        return {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                "choices": choices, "usage": total_usage(runs, updates),
                "spec_decode": choices[0]["spec_decode"] if len(choices) == 1 else
                [c["spec_decode"] for c in choices]}

    async def _stream_completions(rid: str, created: int, runs: list[_Run], body: CompletionRequest):
        base = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
        last: dict[int, Update] = {}
        first = {r.index: True for r in runs}
        offsets = {r.index: 0 for r in runs}
        as_ids = bool(body.return_tokens_as_token_ids)
        async for run, (delta, new_ids, lps, u) in merged(runs, body):
            last[run.index] = u
            if delta is None:
                yield _sse({"error": {"message": u.error, "type": "server_error", "param": None, "code": 500}})
                break
            lp = None
            if lps is not None:
                lp = logprobs_block(new_ids, lps, offsets[run.index], as_ids)
                if lp["tokens"]:
                    offsets[run.index] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            choice = {"index": run.index, "text": (run.echo if first[run.index] else "") + delta, "logprobs": lp,
                      "finish_reason": u.finish_reason if u.finished else None}
            if body.return_token_ids:
                choice["token_ids"] = new_ids
                if first[run.index]:                     # the prompt's ids ride on the first chunk
                    choice["prompt_token_ids"] = run.ids
            first[run.index] = False
            yield _sse(stream_chunk(base, choice, body, run, u))
        for event in stream_end(base, body, runs, last):
            yield event

    def prepare_chat(body: ChatRequest) -> list[_Run]:
        ids = chat_ids(body.messages, body.add_generation_prompt, body.add_special_tokens, body.chat_template,
                       body.documents, body.chat_template_kwargs, body.truncate_prompt_tokens is not None)
        if body.truncate_prompt_tokens is not None:
            ids = ids[-body.truncate_prompt_tokens:]
        # no max_tokens: until the model's maximum length, as vLLM does
        sp = sampling(body, body.max_completion_tokens or body.max_tokens or max(1, llm.max_model_len - len(ids)),
                      None)
        return runs_for([ids], [""], sp, body, "messages")

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        check_fields(body)
        if body.logprobs:
            raise BadRequest("/v1/chat/completions does not return logprobs yet: use /v1/completions with "
                             "logprobs", "logprobs")
        if body.top_logprobs:
            raise BadRequest("top_logprobs needs logprobs, which /v1/chat/completions does not return yet",
                             "top_logprobs")
        if body.prompt_logprobs is not None:
            raise BadRequest("prompt_logprobs are returned by /v1/completions only (send the rendered prompt)",
                             "prompt_logprobs")
        runs = await asyncio.to_thread(prepare_chat, body)
        arrived(runs, request)
        rid = f"chatcmpl-{body.request_id or uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            return StreamingResponse(_stream_chat(rid, created, runs, body), media_type="text/event-stream")
        updates = await run_all(request, runs)
        choices = []
        for run, u in zip(runs, updates):
            text = final_text(output_text(run, u, body), u.stop_reason, body.include_stop_str_in_output)
            choice = {"index": run.index, "message": {"role": "assistant", "content": text},
                      "finish_reason": u.finish_reason, "stop_reason": u.stop_reason}
            if body.return_token_ids:
                choice["token_ids"] = u.token_ids
            choices.append(choice)
        stats = [spec_decode_stats(u) for u in updates]
        out = {"id": rid, "object": "chat.completion", "created": created, "model": model_name, "choices": choices,
               "usage": total_usage(runs, updates), "spec_decode": stats[0] if len(stats) == 1 else stats}
        if body.return_token_ids:
            out["prompt_token_ids"] = runs[0].ids
        return out

    def stream_chunk(base: dict, choice: dict, body, run: _Run, u: Update) -> dict:
        """One streamed chunk of `choice` (completions and chat alike): the stop reason and
        spec-decode counts on a finished choice, usage with continuous_usage_stats."""
        chunk = {**base, "choices": [choice]}
        if u.finished:
            choice["stop_reason"] = u.stop_reason
            chunk["spec_decode"] = spec_decode_stats(u)
        if continuous_usage(body):
            chunk["usage"] = usage(len(run.ids), len(u.token_ids))
        return chunk

    async def _stream_chat(rid: str, created: int, runs: list[_Run], body: ChatRequest):
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}
        for run in runs:
            yield _sse({**base, "choices": [{"index": run.index, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]})
        last: dict[int, Update] = {}
        async for run, (delta, new_ids, _, u) in merged(runs, body):
            last[run.index] = u
            if delta is None:
                yield _sse({"error": {"message": u.error, "type": "server_error", "param": None, "code": 500}})
                break
            choice = {"index": run.index, "delta": {"content": delta} if delta else {},
                      "finish_reason": u.finish_reason if u.finished else None}
            if body.return_token_ids:
                choice["token_ids"] = new_ids
            yield _sse(stream_chunk(base, choice, body, run, u))
        for event in stream_end(base, body, runs, last):
            yield event

    return app


def _or(value, default):
    return default if value is None else value


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
