"""The OpenAI-compatible HTTP API of `mode=serve` (FastAPI on uvicorn); this module only wires it.

Routes: POST /v1/completions, POST /v1/chat/completions (the model's chat template), GET /v1/models,
GET /health, POST /tokenize, POST /detokenize, GET /tokenizer_info (the served tokenizer's
tokenizer_config.json, as vLLM's and lm-eval's remote tokenizer read it), GET /metrics (Prometheus).

Request bodies take every field of vLLM's OpenAI server (mtpx/serve/protocol.py), among them n and
best_of = n (completion j seeded with seed + j), stream_options, prompt_logprobs, echo with logprobs
(the prompt scored: lm-eval's loglikelihood; with max_tokens=0 the prompt alone), min_tokens, the
penalties and logit_bias (in [-100, 100]); beam search, guided decoding and the like only at their
neutral values. An unknown or ill-typed field (strictly: "4" is no integer), a NaN or infinite
float, an unsupported value, malformed JSON, a Content-Type other than application/json or a prompt
the engine cannot run is a 400 with an OpenAI error body naming the field; another model than the
served one a 404 (model_not_found); a body over `max_body_bytes` a 413; a text certainly longer
than the model (more bytes than 4 x the longest token's x max_model_len) a 400 before tokenizing.
Every response carries `usage` and `spec_decode` (drafts, accepted, per position, acceptance length).
Streams are server-sent events, a chunk per engine step that produced text, then `data: [DONE]`;
their deltas concatenate to the non-streamed text (text that may still be a stop string is held
back), each chunk carries its tokens' logprobs, echo rides on the first, and the choices of several
prompts or n > 1 interleave by index. Tokenization and chat templates run off the event loop; a
client that disconnects aborts its requests.

Where each part lives:
- errors.py: OpenAI error bodies, exception handlers, the body-size middleware; auth.py: the API key;
- parsing.py: request checks, tokenization and chat templates, SamplingParams;
- runner.py: a request's runs in the engine loop (async_engine.py), whole or streamed, aborted when
  the client leaves; responses.py: choices, logprobs, usage, spec_decode, server-sent events;
- openai_routes.py, tokenizer_routes.py, ops_routes.py: the routes, which get the shared state
  (state.py) by dependency injection.
"""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from mtpx.engine.llm import LLM
from mtpx.serve import openai_routes, ops_routes, tokenizer_routes
from mtpx.serve.async_engine import AsyncEngine
from mtpx.serve.auth import ApiKey
from mtpx.serve.errors import BadRequest, BodyLimit, InFlight, install_error_handlers
from mtpx.serve.metrics import ServerMetrics
from mtpx.serve.parsing import RequestParser
from mtpx.serve.responses import Formatter, spec_decode_stats
from mtpx.serve.runner import Runner
from mtpx.serve.state import ServeState

__all__ = ["DEFAULT_MAX_BODY_BYTES", "BadRequest", "BodyLimit", "build_app", "spec_decode_stats"]

DEFAULT_MAX_BODY_BYTES = 32 * 2**20


def build_app(llm: LLM, model_name: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              latency_buckets=None, api_key: str | None = None) -> FastAPI:
    """The FastAPI app serving `llm` under the model id `model_name`; request bodies over
    `max_body_bytes` get a 413; latency_buckets: the latency histograms' bounds in seconds (None:
    mtpx.serve.metrics.DEFAULT_LATENCY_BUCKETS); api_key: clients must send it as a bearer token
    (mtpx/serve/auth.py; None: no key). Its engine loop starts with the app (lifespan)
    and stops with it, after its current step. `app.state.engine` is the AsyncEngine (mode=serve
    sets its on_fatal and reads its fatal_error), `app.state.serve` the routes' ServeState,
    `app.state.in_flight` the requests being answered (errors.InFlight)."""
    metrics = ServerMetrics(llm.num_speculative_tokens, lambda: engine.stats, latency_buckets)
    engine = AsyncEngine(llm, on_finish=metrics.record)
    formatter = Formatter(llm)
    state = ServeState(llm, model_name, engine, metrics, RequestParser(llm, model_name), formatter,
                       Runner(engine, formatter))

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="mtpx", lifespan=lifespan)
    app.state.in_flight = InFlight()
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, in_flight=app.state.in_flight)
    if api_key:                 # added last: it runs first, before a body is read
        app.add_middleware(ApiKey, api_key=api_key)
    app.state.engine = engine
    app.state.serve = state
    install_error_handlers(app)
    for router in (ops_routes.router, openai_routes.router, tokenizer_routes.router):
        app.include_router(router)
    return app
