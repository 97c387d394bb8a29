"""The engine loop of `mode=serve`: one background thread owns the LLM's engine and steps it while
any request is in it; asyncio handlers submit requests and read their outputs as they grow.

Requests join and leave between steps (continuous batching across HTTP requests). Each step, the
loop thread publishes one `Update` per request that gained tokens or finished, as a copy, to the
request's asyncio queue (`loop.call_soon_threadsafe`), so several tokens accepted in one step
arrive together. A handler that stops reading (the client disconnected) aborts its request: the
loop thread calls `engine.abort` before its next step, which frees the blocks and the batch slot.
At shutdown, `abort_all` aborts every request, now and arriving later (finish_reason "abort"), so
each stream ends with its final chunk. An exception in a step fails the requests of that step with
its message; the loop goes on,
unless the exception is `fatal` (a dead tensor-parallel worker: mtpx.parallel.spmd): then the
requests fail with its message, `fatal_error` holds it, the loop ends and `on_fatal()` is called
(mode=serve stops its uvicorn server: the failed responses are sent, then the process exits).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from mtpx.engine.llm import LLM
from mtpx.core.request import Request
from mtpx.core.sampling_params import SamplingParams
from mtpx.outputs import SpecDecodeCounts


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


_SERVED: weakref.WeakSet = weakref.WeakSet()    # engines an AsyncEngine loop steps now
_SERVED_LOCK = threading.Lock()


class AsyncEngine:
    """llm: the loaded LLM (its engine is stepped by this object's thread only).
    on_finish(request, first_of_prompt, output_counted) runs in the loop thread for each request
    that ends (metrics; first_of_prompt: False for the 2nd .. n-th completion of a prompt;
    output_counted: False for echo with max_tokens=0). Call start()
    once, shutdown() at the end."""

    def __init__(self, llm: LLM, on_finish: Callable[[Request], None] | None = None):
        self.llm, self.engine, self.on_finish = llm, llm.engine, on_finish
        self._new: deque[Request] = deque()
        self._aborts: deque[int] = deque()
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue, Request, int]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._abort_all = False
        self._repeats: set[int] = set()          # requests whose prompt is another request's (n > 1)
        self._uncounted: set[int] = set()        # requests whose output token is dropped (echo only)
        self.fatal_error: str | None = None
        self.on_fatal: Callable[[], None] | None = None
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._serve, name="mtpx-engine", daemon=True)
        self._snapshot: dict[str, int] = self.engine.stats()
        self._running_ids: set[int] = set()      # in the engine's batch at the last step
        self._waiting_ids: set[int] = set()      # in the engine's queue (added or preempted)

    @property
    def stats(self) -> dict[str, int]:
        """Engine.stats() of the last step, with num_running / num_waiting counted now: a request
        that arrived waits from its arrival (also while a step runs), and one whose client left
        counts no more from that moment, not only after the next step."""
        with self._lock:
            s = dict(self._snapshot)
            gone = set(self._aborts)
            s["num_running"] = len(self._running_ids - gone)
            s["num_waiting"] = len(self._waiting_ids - gone) + sum(r.index not in gone for r in self._new)
        return s

    def start(self) -> None:
        """Start the loop thread. Raises RuntimeError when another AsyncEngine's loop still steps
        this LLM's engine (two loops on one engine would interleave their steps)."""
        with _SERVED_LOCK:
            if self.engine in _SERVED:
                raise RuntimeError("this LLM is already served by another running app: build one app per "
                                   "LLM, or shut the other down first")
            _SERVED.add(self.engine)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self._run()
        finally:
            with _SERVED_LOCK:
                _SERVED.discard(self.engine)

    def abort_all(self) -> None:
        """Abort every request after the current step, and every request submitted from now on
        (shutdown): each gets a last Update with finish_reason "abort"."""
        self._abort_all = True
        self._wake.set()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop thread after its current step (waiting at most `timeout` seconds)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=timeout)

    # ---- the asyncio side --------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       arrival_time: float | None = None,
                       first_of_prompt: bool = True, count_output: bool = True) -> AsyncIterator[Update]:
        """Run one request (arrival_time: time.perf_counter() when its HTTP request arrived, for
        TTFT and E2EL; None: now; first_of_prompt: False when another request of the same HTTP
        request runs the same prompt, so its prompt is counted once; count_output: False when the
        response drops the output token, echo with max_tokens=0); yields an Update after
        every step that changed it, the last one with
        finished=True. Leaving the iteration early (a disconnected client) aborts the request.
        Raises ValueError before queueing when the engine cannot run the prompt (one line)."""
        if self.fatal_error is not None:
            raise RuntimeError(self.fatal_error)
        error = self.engine.validate_prompt(prompt_ids)
        if error:
            raise ValueError(error)
        rid = next(self._ids)
        req = self.llm.new_request(rid, prompt_ids, params)
        req.arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        queue: asyncio.Queue[Update] = asyncio.Queue()
        with self._lock:
            self._streams[rid] = (asyncio.get_running_loop(), queue, req, 0)
            self._new.append(req)
            if not first_of_prompt:
                self._repeats.add(rid)
            if not count_output:
                self._uncounted.add(rid)
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
    def _refresh(self) -> None:
        """The gauges' snapshot (call with the lock held, in the loop thread)."""
        self._snapshot = self.engine.stats()
        self._running_ids = {r.index for r in self.engine.scheduler.running}
        self._waiting_ids = {r.index for r in self.engine.scheduler.waiting}

    def _run(self) -> None:
        while not self._stop:
            failed = []
            with self._lock:              # new requests move into the engine's queue: still waiting
                new, self._new = list(self._new), deque()
                aborts, self._aborts = list(self._aborts), deque()
                if self._abort_all:
                    aborts = list(self._streams)
                for req in new:
                    if not self.engine.add_request(req):    # can never fit the KV pool: fails alone
                        failed.append(req)
                for rid in aborts:
                    entry = self._streams.get(rid)
                    if entry is not None:
                        self.engine.abort(entry[2])
                self._refresh()
            for req in failed + self.engine.pop_aborted():
                self._publish(req, final=True)
            if not self.engine.has_unfinished_requests():
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
            with self._lock:
                self._refresh()
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
                first_of_prompt = req.index not in self._repeats
                counted = req.index not in self._uncounted
                self._repeats.discard(req.index)
                self._uncounted.discard(req.index)
            else:
                self._streams[req.index] = (loop, queue, req, len(req.output_token_ids))
        update = Update(list(req.output_token_ids), finished=final)
        update.logprobs = list(req.logprobs) if req.params.logprobs is not None else None
        if final:
            update.finish_reason, update.stop_reason, update.error = (req.finish_reason, req.stop_reason,
                                                                      req.error)
            update.spec, update.num_cached_tokens = req.spec, req.num_cached_tokens
            update.arrival_time, update.first_token_time = req.arrival_time, req.first_token_time
            update.finish_time = req.finish_time or time.perf_counter()
            update.emission_times = list(req.emission_times)
            update.prompt_logprobs = (dict(req.prompt_logprobs) if req.params.prompt_logprobs is not None
                                      else None)
            if self.on_finish is not None and req.error is None:
                self.on_finish(req, first_of_prompt, counted)
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
