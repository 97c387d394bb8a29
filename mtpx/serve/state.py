"""What the routes of one served model share (`ServeState`, kept on `app.state.serve` by
build_app), and the FastAPI dependency that hands it to a route: a parameter annotated
`State` (FastAPI's Annotated[..., Depends(...)] form)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from mtpx.engine.llm import LLM
from mtpx.serve.async_engine import AsyncEngine
from mtpx.serve.metrics import ServerMetrics
from mtpx.serve.parsing import RequestParser
from mtpx.serve.responses import Formatter
from mtpx.serve.runner import Runner


@dataclass
class ServeState:
    """llm served as model_name; engine: its loop thread (the only owner of llm.engine while the
    app runs); metrics: the Prometheus registry; parser, formatter, runner: request in, response
    out, runs in the engine."""
    llm: LLM
    model_name: str
    engine: AsyncEngine
    metrics: ServerMetrics
    parser: RequestParser
    formatter: Formatter
    runner: Runner


async def serve_state(request: Request) -> ServeState:
    """FastAPI dependency: the app's ServeState (async, so it runs on the event loop, not in a
    thread pool)."""
    return request.app.state.serve


State = Annotated[ServeState, Depends(serve_state)]
