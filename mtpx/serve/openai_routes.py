"""OpenAI's routes: POST /v1/completions, POST /v1/chat/completions (through the model's chat
template) and GET /v1/models.

A generation route parses its body (off the event loop when large) and checks it
(mtpx/serve/parsing.py), tokenizes it off the event loop,
then either runs every choice to its end (mtpx/serve/runner.py) and answers one JSON body, or
streams server-sent events: a chunk per engine step that produced text, then `data: [DONE]`.
Echo rides on a completion stream's first chunk, a chat stream starts with one role chunk per
choice, and several prompts or n > 1 interleave choices by index. A request that fails in the
engine after its stream began ends it with an error event.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from mtpx.serve.async_engine import Update
from mtpx.serve.parsing import Run, read_body
from mtpx.serve.protocol import ChatRequest, CompletionRequest
from mtpx.serve.responses import spec_decode_stats, sse, sse_error, stream_chunk, stream_end, total_usage
from mtpx.serve.state import ServeState, State
from mtpx.serve.structured import ToolCallStream, tool_schema

router = APIRouter()


@router.get("/v1/models")
async def models(state: State):
    return {"object": "list",
            "data": [{"id": state.model_name, "object": "model", "created": int(time.time()),
                      "owned_by": "mtpx", "max_model_len": state.llm.max_model_len}]}


def _arrived(runs: list[Run], request: Request) -> None:
    for run in runs:
        run.arrival_time = getattr(request.state, "arrival_time", None)


def _echo_only(runs: list[Run], updates: list[Update]) -> list[Update]:
    """Updates without the output token of echo-only runs (max_tokens=0: the prompt alone)."""
    return [dataclasses.replace(u, token_ids=[], logprobs=None if u.logprobs is None else [])
            if run.echo_only else u for run, u in zip(runs, updates)]


@router.post("/v1/completions")
async def completions(request: Request, state: State):
    body = await read_body(request, CompletionRequest)
    state.parser.check_completion(body)
    runs = await asyncio.to_thread(state.parser.prepare_completion, body)
    _arrived(runs, request)
    rid = f"cmpl-{body.request_id or uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        return StreamingResponse(_stream_completions(state, rid, created, runs, body),
                                 media_type="text/event-stream")
    updates = _echo_only(runs, await state.runner.run_all(request, runs))
    choices = [state.formatter.completion_choice(run, u, body) for run, u in zip(runs, updates)]
    return {"id": rid, "object": "text_completion", "created": created, "model": state.model_name,
            "choices": choices, "usage": total_usage(runs, updates),
            "spec_decode": choices[0]["spec_decode"] if len(choices) == 1 else
            [c["spec_decode"] for c in choices]}


async def _stream_completions(state: ServeState, rid: str, created: int, runs: list[Run],
                              body: CompletionRequest):
    base = {"id": rid, "object": "text_completion", "created": created, "model": state.model_name}
    last: dict[int, Update] = {}
    first = {r.index: True for r in runs}
    offsets = {r.index: 0 for r in runs}
    as_ids = bool(body.return_tokens_as_token_ids)
    async for run, (delta, new_ids, lps, u) in state.runner.merged(runs, body):
        last[run.index] = u
        if delta is None:
            yield sse_error(u.error)
            break
        lp = None
        if lps is not None:
            lp = state.formatter.logprobs_block(new_ids, lps, offsets[run.index], as_ids)
            if lp["tokens"]:
                offsets[run.index] = lp["text_offset"][-1] + len(lp["tokens"][-1])
        choice = {"index": run.index, "text": (run.echo if first[run.index] else "") + delta, "logprobs": lp,
                  "finish_reason": u.finish_reason if u.finished else None}
        if body.return_token_ids:
            choice["token_ids"] = new_ids
            if first[run.index]:                     # the prompt's ids ride on the first chunk
                choice["prompt_token_ids"] = run.ids
        first[run.index] = False
        yield sse(stream_chunk(base, choice, body, run, u))
    for event in stream_end(base, body, runs, last):
        yield event


@router.post("/v1/chat/completions")
async def chat(request: Request, state: State):
    body = await read_body(request, ChatRequest)
    state.parser.check_chat(body)
    runs = await asyncio.to_thread(state.parser.prepare_chat, body)
    _arrived(runs, request)
    rid = f"chatcmpl-{body.request_id or uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        return StreamingResponse(_stream_chat(state, rid, created, runs, body),
                                 media_type="text/event-stream")
    updates = await state.runner.run_all(request, runs)
    choices = [state.formatter.chat_choice(run, u, body) for run, u in zip(runs, updates)]
    stats = [spec_decode_stats(u) for u in updates]
    out = {"id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
           "choices": choices, "usage": total_usage(runs, updates),
           "spec_decode": stats[0] if len(stats) == 1 else stats}
    if body.return_token_ids:
        out["prompt_token_ids"] = runs[0].ids
    return out


async def _stream_chat(state: ServeState, rid: str, created: int, runs: list[Run], body: ChatRequest):
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.model_name}
    for run in runs:
        yield sse({**base, "choices": [{"index": run.index, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]})
    last: dict[int, Update] = {}
    tools = ({run.index: ToolCallStream(body.tool_choice) for run in runs}
             if tool_schema(body.tools, body.tool_choice) is not None else None)   # a tool-call constraint
    async for run, (delta, new_ids, _, u) in state.runner.merged(runs, body):
        last[run.index] = u
        if delta is None:
            yield sse_error(u.error)
            break
        choice = {"index": run.index, "delta": {"content": delta} if delta else {},
                  "finish_reason": u.finish_reason if u.finished else None}
        if tools is not None:
            choice = tools[run.index].choice(choice, delta, u.finished, body.tool_choice)
        if body.return_token_ids:
            choice["token_ids"] = new_ids
        yield sse(stream_chunk(base, choice, body, run, u))
    for event in stream_end(base, body, runs, last):
        yield event
