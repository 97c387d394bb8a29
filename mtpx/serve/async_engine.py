"""The engine loop of `mode=serve`: one background thread owns the LLM's engine and steps it while
any request is in it; asyncio handlers submit requests and read their outputs as they grow.

Requests join and leave between steps (continuous batching across HTTP requests). Each step, the
loop thread publishes one `Update` per request that gained tokens or finished, as a copy, to the
request's asyncio queue (`loop.call_soon_threadsafe`), so several tokens accepted in one step
arrive together. A handler that stops reading (the client disconnected) aborts its request: the
loop thread calls `engine.abort` before its next step, which frees the blocks and the batch slot.
An exception in a step fails the requests of that step with its message; the loop goes on,
unless the exception is `fatal` (a dead tensor-parallel worker: mtpx.parallel.spmd): then the
requests fail with its message, `fatal_error` holds it, the loop ends and `on_fatal()` is called
(mode=serve stops its uvicorn server: the failed responses are sent, then the process exits).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from mtpx.engine.llm import LLM
from mtpx.engine.request import Request
from mtpx.engine.sampling_params import SamplingParams
from mtpx.metrics.stats import SpecDecodeCounts


@dataclass
class Update:
    """A request's state after a step: every output token so far (token_ids), and when finished
    its finish_reason / stop_reason, error (a failed request), spec counters, times and
    prompt_logprobs; logprobs (one entry per output token so far) on every update."""
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    spec: SpecDecodeCounts | None = None
    num_cached_tokens: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    emission_times: list[float] = field(default_factory=list)
    logprobs: list | None = None
    prompt_logprobs: dict | None = None


class AsyncEngine:
    """llm: the loaded LLM (its engine is stepped by this object's thread only). on_finish(request)
    runs in the loop thread for each request that ends (metrics). Call start() once, shutdown() at
    the end."""

    def __init__(self, llm: LLM, on_finish: Callable[[Request], None] | None = None):
        self.llm, self.engine, self.on_finish = llm, llm.engine, on_finish
        self._new: deque[Request] = deque()
        self._aborts: deque[int] = deque()
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue, Request, int]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self.fatal_error: str | None = None
        self.on_fatal: Callable[[], None] | None = None
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="mtpx-engine", daemon=True)
        self.stats: dict[str, int] = self.engine.stats()

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)

    # ---- the asyncio side --------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[Update]:
        """Run one request; yields an Update after every step that changed it, the last one with
        finished=True. Leaving the iteration early (a disconnected client) aborts the request.
        Raises ValueError before queueing when the engine cannot run the prompt (one line)."""
        if self.fatal_error is not None:
            raise RuntimeError(self.fatal_error)
        error = self.engine.validate_prompt(prompt_ids)
        if error:
            raise ValueError(error)
        rid = next(self._ids)
        req = self.llm.new_request(rid, prompt_ids, params)
        req.arrival_time = time.perf_counter()
        queue: asyncio.Queue[Update] = asyncio.Queue()
        with self._lock:
            self._streams[rid] = (asyncio.get_running_loop(), queue, req, 0)
            self._new.append(req)
        self._wake.set()
        finished = False
        try:
            while True:
                update = await queue.get()
                finished = update.finished
                yield update
                if finished:
                    return
        finally:
            if not finished:
                with self._lock:
                    self._aborts.append(rid)
                self._wake.set()

    # ---- the loop thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                new, self._new = list(self._new), deque()
                aborts, self._aborts = list(self._aborts), deque()
            for req in new:
                if not self.engine.add_request(req):        # can never fit the KV pool: fails alone
                    self._publish(req, final=True)
            for rid in aborts:
                entry = self._streams.get(rid)
                if entry is not None:
                    self.engine.abort(entry[2])
            for req in self.engine.pop_aborted():
                self._publish(req, final=True)
            if not self.engine.has_unfinished_requests():
                self.stats = self.engine.stats()
                self._wake.wait(timeout=0.05)
                self._wake.clear()
                continue
            try:
                finished = {r.index for r in self.engine.step()}
            except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                self._fail_running(f"engine step failed: {type(e).__name__}: {e}")
                if getattr(e, "fatal", False):      # the engine cannot step again: stop serving
                    self.fatal_error = f"engine step failed: {type(e).__name__}: {e}"
                    self._stop = True
                    with self._lock:
                        new, self._new = list(self._new), deque()
                    for req in new:
                        req.error = self.fatal_error
                        self._publish(req, final=True)
                    if self.on_fatal is not None:
                        self.on_fatal()
                    return
                continue
            self.stats = self.engine.stats()
            with self._lock:
                entries = list(self._streams.values())
            for _, _, req, sent in entries:
                if req.index in finished:
                    self._publish(req, final=True)
                elif len(req.output_token_ids) > sent:
                    self._publish(req, final=False)

    def _publish(self, req: Request, final: bool) -> None:
        with self._lock:
            entry = self._streams.get(req.index)
            if entry is None:
                return
            loop, queue, _, _ = entry
            if final:
                del self._streams[req.index]
            else:
                self._streams[req.index] = (loop, queue, req, len(req.output_token_ids))
        update = Update(list(req.output_token_ids), finished=final)
        update.logprobs = list(req.logprobs) if req.params.logprobs is not None else None
        if final:
            update.finish_reason, update.stop_reason, update.error = req.finish_reason, req.stop_reason, req.error
            update.spec, update.num_cached_tokens = req.spec, req.num_cached_tokens
            update.arrival_time, update.first_token_time = req.arrival_time, req.first_token_time
            update.finish_time = req.finish_time or time.perf_counter()
            update.emission_times = list(req.emission_times)
            update.prompt_logprobs = dict(req.prompt_logprobs) if req.params.prompt_logprobs is not None else None
            if self.on_finish is not None and req.error is None:
                self.on_finish(req)
        loop.call_soon_threadsafe(queue.put_nowait, update)

    def _fail_running(self, message: str) -> None:
        with self._lock:
            entries = list(self._streams.values())
        for _, _, req, _ in entries:
            if not req.finished:
                self.engine.abort(req)
                self.engine.pop_aborted()
                req.finish_reason = None
            req.error = message
            self._publish(req, final=True)
