"""The API key of `mode=serve` (serve.api_key or MTPX_API_KEY; vLLM's --api-key / VLLM_API_KEY).

With a key, every HTTP route but PUBLIC_PATHS needs the header `Authorization: Bearer <key>`
(what the openai SDK sends for its `api_key`), else a 401 in OpenAI's error shape (code
"invalid_api_key"). PUBLIC_PATHS are vLLM's public endpoints that mtpx serves: /health,
/metrics and the API docs. Keys are compared as SHA-256 digests with hmac.compare_digest: the
time taken says nothing of the key, its length included.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os

from starlette.datastructures import Headers

from mtpx.serve.errors import error_response

ENV_VAR = "MTPX_API_KEY"
PUBLIC_PATHS = ("/health", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


def resolve_api_key(configured: str | None) -> str | None:
    """serve.api_key, else the environment variable MTPX_API_KEY, else None (an empty string is
    no key)."""
    key = configured if configured is not None else os.environ.get(ENV_VAR)
    return key or None


def is_loopback(host: str) -> bool:
    """Whether `host` (serve.host) listens on this machine only: localhost or a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class ApiKey:
    """ASGI middleware: HTTP requests to any path but PUBLIC_PATHS (and CORS preflights) need
    `Authorization: Bearer <api_key>`; others get a 401 with OpenAI's error body."""

    def __init__(self, app, api_key: str):
        self.app, self.digest = app, _digest(api_key)

    def allowed(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        # compared even when the scheme is wrong: the time taken is the same either way
        same = hmac.compare_digest(_digest(token.strip()), self.digest)
        return same and scheme.lower() == "bearer"

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if (scope["type"] != "http" or scope.get("method") == "OPTIONS"
                or any(path == p or path.startswith(p + "/") for p in PUBLIC_PATHS)):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        if self.allowed(headers):
            return await self.app(scope, receive, send)
        why = ("no API key was sent" if "authorization" not in headers
               else "the API key is not this server's")
        response = error_response(f"{why}: send the header Authorization: Bearer <key> with the server's "
                                  "serve.api_key (the openai SDK's api_key)", None, 401, "invalid_api_key",
                                  headers={"WWW-Authenticate": "Bearer"})
        return await response(scope, receive, send)
