"""Operational routes: GET /health (200 while the server runs) and GET /metrics (Prometheus
text, mtpx/serve/metrics.py)."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from mtpx.serve.state import State

router = APIRouter()


@router.get("/health")
async def health():
    return Response(status_code=200)


@router.get("/metrics")
async def prometheus(state: State):
    return PlainTextResponse(state.metrics.exposition().decode(), media_type="text/plain; version=0.0.4")
