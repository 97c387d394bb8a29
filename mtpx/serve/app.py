"""The OpenAI-compatible HTTP API of `mode=serve` (FastAPI on uvicorn).

Routes: POST /v1/completions, POST /v1/chat/completions (through the model's chat template),
GET /v1/models, GET /health, POST /tokenize, POST /detokenize, GET /metrics (Prometheus text).
Request bodies follow OpenAI's API with vLLM's extensions (top_k, min_p, stop_token_ids,
ignore_eos); an unknown field, a field of the wrong type, malformed JSON or a prompt the engine
cannot run gets a 400 with an OpenAI-style error body naming the field. Every response carries
`usage` and a `spec_decode` field (drafts, accepted, per position, acceptance length). Streams
are server-sent events: one chunk per engine step that produced text (several accepted tokens
in one chunk), then `data: [DONE]`; `stream_options.include_usage` adds a last chunk with usage.
`echo` with `logprobs` scores the prompt (lm-eval's loglikelihood requests): the logprobs cover
the prompt's tokens then the output's. Not supported (400): penalties, `n` > 1, `best_of`, `suffix`.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from mtpx.engine.llm import LLM
from mtpx.engine.sampling_params import SamplingParams
from mtpx.engine.stop_strings import cut_at_stop
from mtpx.serve.async_engine import AsyncEngine, Update
from mtpx.serve.metrics import ServerMetrics


_TYPE_WORDS = {"str", "int", "float", "bool", "list", "dict", "none", "literal"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    frequency_penalty: float = Field(default=0.0, ge=0, le=0)   # penalties are not implemented: 0 only
    presence_penalty: float = Field(default=0.0, ge=0, le=0)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    return_token_ids: bool = False      # vLLM's extension: prompt_token_ids and token_ids in the choices
    logprobs: int | None = Field(default=None, ge=0, le=20)


class ChatMessage(_Body):
    role: str
    content: str
    name: str | None = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


def _error(message: str, param: str | None = None, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": status}}, status_code=status)


def spec_decode_stats(u: Update) -> dict[str, Any]:
    """The response's `spec_decode` field from a finished request's counters."""
    s = u.spec
    return {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens, "accepted_per_position": list(s.accepted_per_position),
            "num_committed_tokens": s.num_committed_tokens, "acceptance_length": s.acceptance_length}


def build_app(llm: LLM, model_name: str) -> FastAPI:
    """The FastAPI app serving `llm` under the model id `model_name`. Its engine loop starts with
    the app (lifespan) and stops with it."""
    from contextlib import asynccontextmanager

    metrics = ServerMetrics(llm.num_speculative_tokens, lambda: engine.stats)
    engine = AsyncEngine(llm, on_finish=metrics.record)

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="mtpx", lifespan=lifespan)
    app.state.engine = engine
    tok = llm.tokenizer

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        # pydantic names the union member that failed (prompt.str, prompt.list[int]): not a field
        field_loc = [x for x in loc if x.isdigit() or (x.isidentifier() and x not in _TYPE_WORDS)]
        param = ".".join(field_loc) or None
        if err.get("type") == "json_invalid":
            return _error(f"malformed JSON body: {err.get('msg')}", None)
        if err.get("type") == "extra_forbidden":
            return _error(f"unknown field '{param}'", param)
        if len(field_loc) < len(loc):
            return _error(f"{param}={err.get('input')!r}: wrong type for this field", param)
        return _error(f"{param}: {err.get('msg')}" if param else str(err.get("msg")), param)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest):
        return _error(exc.message, exc.param)

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise BadRequest(f"model '{name}' is not served here: use '{model_name}' (GET /v1/models)", "model")

    def encode(text: str, param: str) -> list[int]:
        if tok is None:
            raise BadRequest("this model has no tokenizer: send token ids", param)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"{param} is not valid Unicode text", param) from None
        return llm.encode(text)

    def chat_ids(messages: list[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        if tok is None or getattr(tok, "chat_template", None) is None or not hasattr(tok, "apply_chat_template"):
            raise BadRequest(f"model '{model_name}' has no chat template: use /v1/completions with a plain prompt",
                             "messages")
        try:
            rendered = tok.apply_chat_template([m.model_dump(exclude_none=True) for m in messages],
                                               add_generation_prompt=add_generation_prompt)
        except Exception as e:  # noqa: BLE001 - the template's own errors (raise_exception, bad roles)
            raise BadRequest(f"the chat template failed: {e}", "messages") from None
        # the template holds the special tokens: encode without adding them (as transformers does)
        return list(tok.encode(rendered, add_special_tokens=False).ids)

    def sampling(body: _Sampling, max_tokens: int, logprobs: int | None) -> SamplingParams:
        check_model(body.model)
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                  top_k=body.top_k, min_p=body.min_p, seed=body.seed, stop=body.stop,
                                  stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
                                  logprobs=logprobs)
        except ValueError as e:
            raise BadRequest(str(e)) from None

    def check_fits(ids: list[int], sp: SamplingParams, param: str) -> None:
        error = llm.engine.validate_prompt(ids)
        if error:
            raise BadRequest(error, param)
        if len(ids) + sp.max_tokens > llm.max_model_len:
            raise BadRequest(f"max_tokens={sp.max_tokens} with a {len(ids)}-token prompt exceeds the model's "
                             f"maximum length {llm.max_model_len}: lower max_tokens", "max_tokens")

    def text_of(ids: list[int], u: Update, sp: SamplingParams) -> str:
        """The output text as the client sees it: cut before a matched stop string; while running,
        held back where a stop string may be starting and at an incomplete UTF-8 character."""
        text = llm.decode(ids)
        if u.finished:
            return cut_at_stop(text, u.stop_reason) if isinstance(u.stop_reason, str) else text
        text = text.rstrip("\ufffd")
        hold = max((len(s) for s in sp.stop), default=1) - 1
        return text[: len(text) - hold] if hold > 0 else text

    def logprobs_block(ids: list[int], u: Update, prompt_ids: list[int] | None = None) -> dict | None:
        """OpenAI's completion logprobs: tokens, token_logprobs, top_logprobs (the token and the
        top N, by text), text_offset; with echo (prompt_ids) the prompt's tokens come first, the
        first of them without a logprob."""
        if u.logprobs is None:
            return None
        entries = list(u.logprobs)
        all_ids = list(ids)
        if prompt_ids is not None:
            scored = u.prompt_logprobs or {}
            entries = [None] + [scored.get(i) for i in range(1, len(prompt_ids))] + entries
            all_ids = list(prompt_ids) + all_ids
        tokens = [llm.decode([t]) for t in all_ids]
        token_lps, tops = [], []
        for t, e in zip(all_ids, entries):
            if e is None:
                token_lps.append(None)
                tops.append(None)
                continue
            lp, _, top = e
            token_lps.append(lp)
            tops.append({llm.decode([i]): v for i, v in top} | {llm.decode([t]): lp})
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
                "text_offset": list(itertools_accumulate(tokens, 0))}

    def usage(prompt_len: int, completion_len: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_len, "completion_tokens": completion_len,
                "total_tokens": prompt_len + completion_len}

    async def run_one(ids: list[int], sp: SamplingParams) -> Update:
        last = None
        try:
            async for u in engine.generate(ids, sp):
                last = u
        except ValueError as e:
            raise BadRequest(str(e), "prompt") from None
        if last.error:
            raise BadRequest(last.error)
        return last

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

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise BadRequest("give exactly one of prompt or messages", "prompt")
        ids = encode(body.prompt, "prompt") if body.prompt is not None else chat_ids(body.messages,
                                                                                   body.add_generation_prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": llm.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < llm.model.cfg.vocab_size]
        if bad:
            raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {llm.model.cfg.vocab_size})",
                             "tokens")
        return {"prompt": llm.decode(body.tokens)}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        sp = sampling(body, body.max_tokens or 16, body.logprobs)   # OpenAI's default: 16 tokens
        if body.echo and body.logprobs is not None:    # prompt scoring (lm-eval's loglikelihood requests)
            if body.stream:
                raise BadRequest("echo with logprobs (prompt scoring) is not streamed: set stream=false", "stream")
            sp = dataclasses.replace(sp, prompt_logprobs=body.logprobs)
        prompts = body.prompt if isinstance(body.prompt, list) and body.prompt and not isinstance(
            body.prompt[0], int) else [body.prompt]
        if not prompts:
            raise BadRequest("prompt is empty: give at least one token", "prompt")
        texts = [p if isinstance(p, str) else None for p in prompts]
        all_ids = [encode(p, "prompt") if isinstance(p, str) else list(p) for p in prompts]
        for ids in all_ids:
            check_fits(ids, sp, "prompt")
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            return StreamingResponse(_stream_completions(rid, created, all_ids, texts, sp, body),
                                     media_type="text/event-stream")
        import asyncio
        updates = await asyncio.gather(*(run_one(ids, sp) for ids in all_ids))
        choices = []
        for i, (u, t) in enumerate(zip(updates, texts)):
            text = text_of(u.token_ids, u, sp)
            prefix = (t if t is not None else llm.decode(all_ids[i])) if body.echo else ""
            choices.append({"index": i, "text": prefix + text,
                            "logprobs": logprobs_block(u.token_ids, u, all_ids[i] if body.echo else None),
                            "finish_reason": u.finish_reason,
                            "stop_reason": u.stop_reason, "spec_decode": spec_decode_stats(u)})
            if body.return_token_ids:
                choices[-1] |= {"prompt_token_ids": all_ids[i], "token_ids": u.token_ids}
        prompt_len = sum(len(ids) for ids in all_ids)
        out_len = sum(len(u.token_ids) for u in updates)
        return {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                "choices": choices, "usage": usage(prompt_len, out_len),
                "spec_decode": choices[0]["spec_decode"] if len(choices) == 1 else
                [c["spec_decode"] for c in choices]}

    async def text_deltas(ids: list[int], sp: SamplingParams):
        """(new text, new token ids, update) per engine update of one request; a failed request
        ends the stream as `(None, [], update)`."""
        sent, sent_ids = "", 0
        async for u in engine.generate(ids, sp):
            if u.error:
                yield None, [], u
                return
            text = text_of(u.token_ids, u, sp)
            delta, sent = text[len(sent):], text
            new_ids, sent_ids = u.token_ids[sent_ids:], len(u.token_ids)
            yield delta, new_ids, u

    def stream_end(base: dict, body: _Sampling, ids: list[int], last: Update | None) -> list[str]:
        """A stream's last events: the usage chunk (stream_options.include_usage), then [DONE]."""
        events = []
        if last is not None and not last.error and body.stream_options and body.stream_options.include_usage:
            events.append(_sse({**base, "choices": [], "usage": usage(len(ids), len(last.token_ids))}))
        return events + ["data: [DONE]\n\n"]

    async def _stream_completions(rid, created, all_ids, texts, sp, body):
        if len(all_ids) != 1:
            yield _sse({"error": {"message": "streaming takes one prompt per request", "param": "prompt"}})
            yield "data: [DONE]\n\n"
            return
        ids, last = all_ids[0], None
        base = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
        prefix = texts[0] if body.echo and texts[0] else ""
        try:
            pending: list[int] = []
            first = True
            async for delta, new_ids, u in text_deltas(ids, sp):
                last = u
                if delta is None:
                    yield _sse({"error": {"message": u.error, "type": "server_error"}})
                    break
                pending += new_ids
                if prefix + delta or u.finished:
                    choice = {"index": 0, "text": prefix + delta, "logprobs": None,
                              "finish_reason": u.finish_reason if u.finished else None}
                    if body.return_token_ids:
                        choice["token_ids"], pending = pending, []
                        if first:                        # the prompt's ids ride on the first chunk
                            choice["prompt_token_ids"] = ids
                    prefix, first = "", False
                    chunk = {**base, "choices": [choice]}
                    if u.finished:
                        choice["stop_reason"] = u.stop_reason
                        chunk["spec_decode"] = spec_decode_stats(u)
                    yield _sse(chunk)
        except ValueError as e:
            yield _sse({"error": {"message": str(e), "param": "prompt"}})
        for event in stream_end(base, body, ids, last):
            yield event

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        if body.logprobs or body.top_logprobs is not None:
            raise BadRequest("/v1/chat/completions does not return logprobs yet: use /v1/completions with "
                             "logprobs", "logprobs")
        ids = chat_ids(body.messages)
        # no max_tokens: until the model's maximum length, as vLLM does
        sp = sampling(body, body.max_completion_tokens or body.max_tokens or max(1, llm.max_model_len - len(ids)),
                      None)
        check_fits(ids, sp, "messages")
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            return StreamingResponse(_stream_chat(rid, created, ids, sp, body), media_type="text/event-stream")
        u = await run_one(ids, sp)
        stats = spec_decode_stats(u)
        return {"id": rid, "object": "chat.completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text_of(u.token_ids, u, sp)},
                             "finish_reason": u.finish_reason, "stop_reason": u.stop_reason}],
                "usage": usage(len(ids), len(u.token_ids)), "spec_decode": stats}

    async def _stream_chat(rid, created, ids, sp, body):
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}
        yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})
        last = None
        async for delta, _, u in text_deltas(ids, sp):
            last = u
            if delta is None:
                yield _sse({"error": {"message": u.error, "type": "server_error"}})
                break
            if delta or u.finished:
                chunk = {**base, "choices": [{"index": 0, "delta": {"content": delta} if delta else {},
                                              "finish_reason": u.finish_reason if u.finished else None}]}
                if u.finished:
                    chunk["spec_decode"] = spec_decode_stats(u)
                yield _sse(chunk)
        for event in stream_end(base, body, ids, last):
            yield event

    return app


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def itertools_accumulate(tokens: list[str], offset: int):
    """Character offsets of each token's text (OpenAI's text_offset)."""
    pos = offset
    for t in tokens:
        yield pos
        pos += len(t)
