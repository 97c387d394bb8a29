"""The contenders of tools/bench_speedup.py: one engine each, driven chunk by chunk, in this process
(`Contender`) or in a process of its own (`IsolatedContender`, --isolate), through the same calls.

A contender generates a chunk either whole (`generate`, the chunk mode) or step by step
(`start` the chunk, `run_steps` N steps per turn while the driver rotates the contenders, `finish`);
`finish` and `generate` return the chunk's summary: {"token_ids": [[int]], "tokens": int, "seconds":
float (its generate, or its timed `Engine.step` calls with the admissions before each), "host_s":
float (encoding the prompts and decoding the outputs, outside "seconds")}. `report()` gives what the
tool's row needs from the engine after the last chunk: {"acceptance_length": float,
"engine_time": dict, "auto_k": dict | None}.

Why processes: on this machine an engine built earlier in a process steps slower than one built later
(about 1-3% per engine built in between). --isolate makes every engine the only engine of a fresh
process; the driver still runs one contender at a time (it waits for each worker's reply), so the
workers never run at once. Measured, the effect survives it (the engine built first still reads
slowest: experiments/auto_k_never_loses, section 6), so it lies outside the process; bracketing over
the build order (--build-reversed) remains the remedy.
"""
from __future__ import annotations

import ctypes
import importlib.util
import multiprocessing as mp
import os
import signal
import sys
import time
from typing import Callable

import torch

from mtpx import auto_k
from mtpx.metrics.stats import aggregate_spec


class Contender:
    """One contender's engine in this process. llm: mtpx.LLM; engine_time(timings, llm) -> dict (the
    tool's summary of its StepTimings)."""

    def __init__(self, llm, engine_time: Callable, compile_s: float | None = None):
        self.llm, self._engine_time, self.compile_s = llm, engine_time, compile_s
        self.calibration = llm.calibration
        self._outputs, self.timings = [], []     # timings: every chunk's StepTimings
        auto_k.reset_histograms(llm.engine.draft_length)      # the timed chunks only, not the warm-up

    def generate(self, chunk: list[str], params, concurrency: int) -> dict:
        self.llm.engine.reset_step_timings()
        t0 = time.perf_counter()
        outs = self.llm.generate(chunk, params, max_concurrency=concurrency)
        return self._summary(outs, time.perf_counter() - t0, 0.0)

    def start(self, chunk: list[str], params, concurrency: int) -> None:
        llm = self.llm
        llm.engine.reset_step_timings()
        t0 = time.perf_counter()
        ids = [llm.encode(p) for p in chunk]
        self._reqs = [llm.new_request(i, x, params, llm.engine.validate_prompt(x)) for i, x in enumerate(ids)]
        self._host = time.perf_counter() - t0
        self._pending = [r for r in reversed(self._reqs) if r.error is None]    # popped from the end
        self._concurrency, self._flight, self._spent = concurrency, 0, 0.0

    def run_steps(self, n: int) -> bool:
        """Up to n timed engine steps (admitting as LLM.generate's client does) -> whether the chunk
        still has work."""
        engine = self.llm.engine
        with torch.inference_mode():
            for _ in range(n):
                t0 = time.perf_counter()
                while self._pending and self._flight < self._concurrency:
                    r = self._pending.pop()
                    r.arrival_time = t0
                    self._flight += engine.add_request(r)
                if not engine.has_unfinished_requests():
                    break
                self._flight -= len(engine.step())
                self._spent += time.perf_counter() - t0
        return bool(self._pending) or engine.has_unfinished_requests()

    def finish(self) -> dict:
        t0 = time.perf_counter()
        outs = [self.llm.request_output(r) for r in self._reqs]
        return self._summary(outs, self._spent, self._host + time.perf_counter() - t0)

    def _summary(self, outs, seconds: float, host_s: float) -> dict:
        self._outputs.extend(outs)
        self.timings.extend(self.llm.engine.step_timings)
        ids = [list(o.output_token_ids) for o in outs]
        return {"token_ids": ids, "tokens": sum(map(len, ids)), "seconds": seconds, "host_s": host_s}

    def report(self) -> dict:
        summary = auto_k.summary(self.llm.engine.draft_length)
        return {"acceptance_length": aggregate_spec(self._outputs).acceptance_length,
                "engine_time": self._engine_time(self.timings, self.llm),
                "auto_k": None if summary is None else {**summary, "calibration": self.calibration}}


def _serve(conn, build: tuple, name: str) -> None:
    """A worker process: build the contender (IsolatedContender's build), answer the driver's calls.
    It ends with the driver: a SIGTERM when the driver's process dies (Linux), so that a killed run
    leaves no engine building or waiting."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)            # PR_SET_PDEATHSIG
        if os.getppid() == 1:                                   # the driver died before that
            return
    try:
        path, function, build_args = build
        spec = importlib.util.spec_from_file_location("_bench_tool", path)
        tool = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tool)
        contender = getattr(tool, function)(build_args, name)
        conn.send(("ready", {"compile_s": contender.compile_s, "calibration": contender.calibration}))
        while True:
            method, call_args = conn.recv()
            conn.send(("ok", getattr(contender, method)(*call_args)))
    except EOFError:                 # the driver is gone
        pass
    except BaseException as e:       # noqa: BLE001 - the driver reports it and stops the run
        conn.send(("error", f"{name}: {type(e).__name__}: {e}"))
        raise
    finally:
        conn.close()


class IsolatedContender:
    """A Contender in a process of its own (spawned: a fresh interpreter; scheduling policy and CPU
    affinity are inherited). build: (path of a tool's .py file, the name of its function f, a picklable
    argument a); the worker loads the file and builds f(a, name) -> Contender."""

    def __init__(self, build: tuple, name: str):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, build, name), name=f"bench-{name}", daemon=True)
        self._proc.start()
        child.close()
        info = self._reply()
        self.compile_s, self.calibration = info["compile_s"], info["calibration"]

    def _reply(self):
        try:
            status, value = self._conn.recv()
        except EOFError:
            code = self._proc.exitcode
            raise SystemExit(f"error: a contender's process ended (exit code {code})") from None
        if status == "error":
            raise SystemExit(f"error: {value}")
        return value

    def _call(self, method: str, *call_args):
        self._conn.send((method, call_args))
        return self._reply()

    def generate(self, chunk, params, concurrency):
        return self._call("generate", chunk, params, concurrency)

    def start(self, chunk, params, concurrency):
        return self._call("start", chunk, params, concurrency)

    def run_steps(self, n):
        return self._call("run_steps", n)

    def finish(self):
        return self._call("finish")

    def report(self):
        return self._call("report")

    def close(self) -> None:
        """End the worker: it has replied to every call, so nothing is lost by killing it (a polite
        close was seen to leave the driver waiting for a worker that never read it)."""
        self._proc.kill()
        self._proc.join(timeout=30)
        self._conn.close()


def run_chunk(contenders: dict, chunk: list[str], params, c: int, concurrency: int, interleave: int) -> dict:
    """One chunk for every contender -> {name: chunk summary}. interleave 0: whole generates in an order
    rotated per chunk; N > 0: every contender starts the chunk, then N steps each per turn, the order
    rotated by one each turn (tools/bench_speedup.py's module doc)."""
    names = list(contenders)
    if not interleave:
        return {n: contenders[n].generate(chunk, params, concurrency)
                for n in names[c % len(names):] + names[: c % len(names)]}
    for contender in contenders.values():
        contender.start(chunk, params, concurrency)
    active, turn = names, c
    while active:
        done = set()
        for name in active[turn % len(active):] + active[: turn % len(active)]:
            if not contenders[name].run_steps(interleave):
                done.add(name)
        active = [n for n in active if n not in done]
        turn += 1
    return {n: contenders[n].finish() for n in names}
