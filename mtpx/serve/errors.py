"""Errors of the HTTP API (mtpx/serve/app.py) as OpenAI-style JSON bodies
({"error": {"message", "type", "param", "code"}}), and the middleware that bounds a request body.

`install_error_handlers` maps every failure a route can meet to one such body: a body that
pydantic rejects (malformed JSON, an unknown field, a wrong type) and a `BadRequest` raised by
parsing or the engine get a 400 naming the field, an unknown route or method its 404 / 405, a
body over `max_body_bytes` a 413 (`BodyLimit`), and a client that left (`ClientGone`) a bodiless
499 nobody reads.
"""
from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPE_WORDS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "any"}


class BadRequest(Exception):
    """A request the server refuses: `message` (one line), the field it names (`param`, None for
    the request as a whole), the HTTP `status` (400 unless said) and the error body's `code`
    (None: the status)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class ClientGone(Exception):
    """The client of a non-streamed request disconnected: its requests were aborted."""


def error_response(message: str, param: str | None = None, status: int = 400,
                   code: str | int | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error body with HTTP status `status` (type server_error from 500 on; code: the
    status unless given, e.g. "model_not_found", "invalid_api_key")."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"message": message, "type": kind, "param": param, "code": status if code is None else code}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """pydantic's first complaint about a body as one 400 naming the field."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    # pydantic names the union member that failed (prompt.str, prompt.list[int]): not a field
    field_loc = [x for x in loc if x.isdigit() or (x.isidentifier() and x not in _TYPE_WORDS)]
    param = ".".join(field_loc) or None
    if err.get("type") == "json_invalid":
        why = (err.get("ctx") or {}).get("error")
        return error_response(f"malformed JSON body: {why or err.get('msg')}", None)
    if not loc:                         # the body as a whole: empty, not an object, not JSON
        got = "an empty body" if err.get("type") == "missing" else f"{type(err.get('input')).__name__}"
        return error_response(f"the request body must be a JSON object with content-type: application/json "
                              f"(got {got})", None)
    if err.get("type") == "extra_forbidden":
        return error_response(f"unknown field '{param}'", param)
    if len(field_loc) < len(loc):
        return error_response(f"{param}={_short(err.get('input'))}: wrong type for this field", param)
    if param and err.get("type", "").endswith("_type"):       # "4" or true for an integer, ...
        return error_response(f"{param}={_short(err.get('input'))}: {err.get('msg')}", param)
    return error_response(f"{param}: {err.get('msg')}" if param else str(err.get("msg")), param)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(f"{exc.detail}: {request.method} {request.url.path}", None, exc.status_code)


async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
    return error_response(exc.message, exc.param, exc.status, exc.code)


async def client_gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)          # nginx's "client closed request": nobody reads it


def install_error_handlers(app: FastAPI) -> None:
    """Answer validation errors, HTTP errors, BadRequest and ClientGone as above."""
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(BadRequest, bad_request)
    app.add_exception_handler(ClientGone, client_gone)


class InFlight:
    """The HTTP requests that BodyLimit handed to the app (body read whole) and that have not
    ended: a request still uploading its body is not among them (shutdown: mtpx/serve/server.py)."""

    def __init__(self):
        self.count = 0


class BodyLimit:
    """ASGI middleware: reads each HTTP body whole, answering 413 (OpenAI error shape) once it
    passes `max_bytes`, then hands it to `app` (later receive() calls go to the client, so
    disconnects are still seen), counted in `in_flight` while the app runs."""

    def __init__(self, app, max_bytes: int, in_flight: InFlight | None = None):
        self.app, self.max_bytes = app, max_bytes
        self.in_flight = InFlight() if in_flight is None else in_flight

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

        self.in_flight.count += 1
        try:
            return await self.app(scope, replay, send)
        finally:
            self.in_flight.count -= 1

    async def _too_large(self, scope, receive, send):
        response = error_response(f"request body is larger than the server's limit of {self.max_bytes} bytes "
                                  "(serve.max_body_bytes): send a shorter prompt", None, 413)
        await response(scope, receive, send)
