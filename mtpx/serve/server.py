"""`mode=serve`: load the model and speculator of the run config, then serve them over HTTP
(mtpx/serve/app.py) on serve.host:serve.port with uvicorn until Ctrl-C or SIGTERM.

Shutdown (vLLM's --shutdown-timeout): on SIGTERM or Ctrl-C the server stops accepting
connections, lets in-flight requests finish for up to serve.shutdown_timeout seconds, then aborts
the rest (their streams end, their blocks are freed), stops the engine after its current step and
exits 0. A second Ctrl-C quits at once."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from mtpx.engine.config import resolve_compile
from mtpx.engine.llm import DEFAULT_MODEL, LLM
from mtpx.engine.threads import choose_threads
from mtpx.evaluate import engine_args, spec_args
from mtpx.serve.metrics import check_buckets


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
    llm = LLM(model=path, spec=method, num_speculative_tokens=k, dtype=cfg.model.get("dtype") or "float32",
              draft_path=spec.get("draft_path") if spec is not None else None,
              allow_pickle=bool(cfg.model.get("allow_pickle", False)), **engine, **spec_args(spec),
              threads=lambda model: choose_threads(model, cfg.serve.get("threads"), "serve.threads"))
    print(llm.thread_choice.describe())
    return llm


def run_serve(cfg: DictConfig) -> int:
    """Serve until interrupted (module doc). Returns the exit code (0; 1 when the engine failed for
    good: a dead tensor-parallel worker)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()    # uvicorn would raise it again after draining: exit 0

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
    llm = load_llm(cfg)
    name = s.get("model_name") or Path(str(cfg.model.get("path") or DEFAULT_MODEL)).name
    app = build_app(llm, name, max_body_bytes=s.max_body_bytes, latency_buckets=buckets)
    spec = f"{llm.spec} k={llm.num_speculative_tokens}" if llm.speculator is not None else "plain decoding"
    print(f"serving {name} ({spec}) at http://{s.host}:{s.port}/v1  (Ctrl-C stops)", flush=True)
    # log_config=None: uvicorn's dictConfig would close the handlers of the run's log file
    server = Server(uvicorn.Config(app, host=s.host, port=s.port, log_level="warning", log_config=None,
                                   timeout_graceful_shutdown=timeout))
    # a dead tensor-parallel worker
    app.state.engine.on_fatal = lambda: setattr(server, "should_exit", True)
    server.run()
    if app.state.engine.fatal_error is not None:      # e.g. a tensor-parallel worker died
        print(f"mode=serve stopped: {app.state.engine.fatal_error}", file=sys.stderr)
        return 1
    print("server stopped")
    return 0
