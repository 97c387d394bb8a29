"""`mode=serve`: load the model and speculator of the run config, then serve them over HTTP
(mtpx/serve/app.py) on serve.host:serve.port with uvicorn until Ctrl-C or SIGTERM.

The listening socket is bound before the model loads: a port in use or a host this machine cannot
listen on is one line naming serve.port / serve.host (exit status 2), and "serving ... at URL"
(the real port with serve.port=0) is printed once the server listens. Binding beyond the loopback
address without an API key (serve.api_key, MTPX_API_KEY; mtpx/serve/auth.py) prints one warning.

Shutdown (vLLM's --shutdown-timeout): on SIGTERM or Ctrl-C the server stops accepting
connections, lets in-flight requests finish for up to serve.shutdown_timeout seconds, then aborts
the rest: each ends as a finished request with finish_reason "abort" (a stream with its last chunk
and `data: [DONE]`, a non-streamed request with its response), sent within ABORT_GRACE_S; then it
stops the engine after its current step and exits 0. An idle server exits at once: connections
without a request past its body (keep-alive, or still uploading one) are closed. A second Ctrl-C
quits at once."""
from __future__ import annotations

import asyncio
import errno
import socket
import sys
from pathlib import Path

from omegaconf import DictConfig

from mtpx.engine.config import resolve_compile
from mtpx.engine.llm import DEFAULT_MODEL, LLM
from mtpx.engine.threads import choose_threads, oversubscription_warning
from mtpx.evaluate import engine_args, spec_args
from mtpx.serve.auth import ENV_VAR, is_loopback, resolve_api_key
from mtpx.serve.metrics import check_buckets

ABORT_GRACE_S = 5.0     # for aborted requests' last chunks to be sent, after serve.shutdown_timeout


def load_llm(cfg: DictConfig) -> LLM:
    """The LLM a run config describes (model, spec, engine), with threads from serve.threads."""
    spec = cfg.get("spec")
    k = spec.num_speculative_tokens if spec is not None else None
    method = None if spec is None or k == 0 else spec.method
    path = cfg.model.get("path") or DEFAULT_MODEL
    engine = engine_args(cfg.engine)
    engine["compile"] = resolve_compile(engine.get("compile"), "serve")
    if cfg.serve.get("threads") is not None:
        choose_threads(None, cfg.serve.threads, "serve.threads")
    tp_size = int(engine.get("tensor_parallel_size") or 1)
    if (line := oversubscription_warning(cfg.serve.get("threads"), tp_size, "serve.threads")) is not None:
        print(line)
    llm = LLM(model=path, spec=method, num_speculative_tokens=k, dtype=cfg.model.get("dtype") or "float32",
              draft_path=spec.get("draft_path") if spec is not None else None,
              allow_pickle=bool(cfg.model.get("allow_pickle", False)), **engine, **spec_args(spec),
              threads=lambda model: choose_threads(model, cfg.serve.get("threads"), "serve.threads"))
    print(llm.thread_choice.describe())
    return llm


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening); ValueError naming serve.host or
    serve.port (and the fix) when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"serve.port={port}: the port is in use on {host} (another server?): stop that "
                             "server or choose another port (serve.port=0 picks a free one)") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise ValueError(f"serve.port={port}: not allowed to listen on it ({e.strerror}): ports below "
                             "1024 need privileges, choose e.g. serve.port=8000") from None
        raise ValueError(f"serve.host={host!r}: cannot listen on it ({e.strerror or e}): use 127.0.0.1 "
                         "(this machine), 0.0.0.0 (every interface) or an address of this machine") from None
    return sock


def url_of(host: str, port: int) -> str:
    host = host.strip("[]")
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


def run_serve(cfg: DictConfig) -> int:
    """Serve until interrupted (module doc). Returns the exit code (0; 1 when the engine failed for
    good: a dead tensor-parallel worker)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()    # uvicorn would raise it again after draining: exit 0

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                print(f"serving {name} ({spec}) at {url_of(s.host, sock.getsockname()[1])}  (Ctrl-C stops)",
                      flush=True)

        async def shutdown(self, sockets=None):
            """uvicorn's graceful shutdown, with the engine's abort at the timeout (module doc)
            instead of cancelling the requests' tasks mid-response."""
            for server in self.servers:
                server.close()
            for connection in list(self.server_state.connections):
                connection.shutdown()         # idle keep-alive connections close now
            in_flight = app.state.in_flight
            await self.drain(lambda: in_flight.count, timeout)
            if in_flight.count and not self.force_exit:
                app.state.engine.abort_all()
                await self.drain(lambda: in_flight.count, ABORT_GRACE_S)
            for connection in list(self.server_state.connections):   # e.g. a body never finished
                connection.transport.close()
            await self.drain(lambda: self.server_state.tasks, 1.0)
            for task in list(self.server_state.tasks):   # not expected: a request stuck outside the engine
                task.cancel()
            if not self.force_exit:
                await self.lifespan.shutdown()

        async def drain(self, busy, seconds: float) -> None:
            """While busy() and not forced to exit, for at most `seconds`."""
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            while busy() and not self.force_exit and loop.time() < end:
                await asyncio.sleep(0.02)

    from mtpx.serve.app import build_app

    s = cfg.serve
    if not isinstance(s.port, int) or not 0 <= s.port < 65536:
        raise ValueError(f"serve.port={s.port!r}: must be a port number in [0, 65535]")
    if not isinstance(s.max_body_bytes, int) or s.max_body_bytes < 1:
        raise ValueError(f"serve.max_body_bytes={s.max_body_bytes!r}: must be a positive number of bytes")
    timeout = s.shutdown_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"serve.shutdown_timeout={timeout!r}: must be seconds >= 0 (0 aborts in-flight "
                         "requests at once)")
    buckets = None if s.latency_buckets is None else check_buckets(s.latency_buckets)
    api_key = resolve_api_key(s.get("api_key"))
    sock = bind(s.host, s.port)               # before loading: a port in use is known at once
    try:
        llm = load_llm(cfg)
        name = s.get("model_name") or Path(str(cfg.model.get("path") or DEFAULT_MODEL)).name
        app = build_app(llm, name, max_body_bytes=s.max_body_bytes, latency_buckets=buckets, api_key=api_key)
        spec = (f"{llm.spec} k={llm.num_speculative_tokens}" if llm.speculator is not None
                else "plain decoding")
        if api_key is None and not is_loopback(s.host):
            print(f"warning: serve.host={s.host} listens beyond this machine without an API key: anyone who "
                  f"reaches the port can generate; set serve.api_key or {ENV_VAR}", file=sys.stderr,
                  flush=True)
        # log_config=None: uvicorn's dictConfig would close the handlers of the run's log file
        server = Server(uvicorn.Config(app, host=s.host, port=s.port, log_level="warning", log_config=None,
                                       timeout_graceful_shutdown=timeout))
        # a dead tensor-parallel worker
        app.state.engine.on_fatal = lambda: setattr(server, "should_exit", True)
        server.run(sockets=[sock])
    finally:
        sock.close()
    if app.state.engine.fatal_error is not None:      # e.g. a tensor-parallel worker died
        print(f"mode=serve stopped: {app.state.engine.fatal_error}", file=sys.stderr)
        return 1
    print("server stopped")
    return 0
