"""The benchmark client over the engine's online API (`run_client`: requests arrive at their
arrival offsets, at most max_concurrency in the engine at once), as LLM.generate, mode=eval and
mode=bench drive the engine, and generate's progress bar (`progress_bar`)."""
from __future__ import annotations

import sys
import time
from collections import deque

import torch

from mtpx.engine.engine import Engine
from mtpx.core.request import Request


def progress_bar(use_tqdm, total: int):
    """generate's progress bar: None for use_tqdm False, tqdm (or the callable given) else."""
    if use_tqdm is False or use_tqdm is None:
        return None
    if callable(use_tqdm):
        return use_tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
    if use_tqdm is not True:
        raise ValueError(f"use_tqdm={use_tqdm!r}: give True, False or a tqdm-like callable")
    from tqdm import tqdm
    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True, file=sys.stderr)


def run_client(engine: Engine, requests: list[Request], on_finish=None, on_step=None,
               max_concurrency: int | None = None) -> None:
    """The benchmark client over the engine's online API: requests arrive at their arrival_offset
    (seconds after the start) with at most max_concurrency in the engine at once (None = no
    limit); each one's arrival_time is when it arrived, or when the client got a free slot,
    whichever is later. on_finish(request) after the step it ended in (stop, length, abort, or a
    request that can never fit); on_step(engine) after every step (both may call engine.abort).
    Runs under torch.inference_mode, so a compiled decode step never recompiles for the caller's
    grad mode. Raises ValueError for max_concurrency < 1."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency={max_concurrency}: must be >= 1 or None (eval.concurrency)")
    pending = deque(sorted(requests, key=lambda r: r.arrival_offset))
    start = time.perf_counter()
    in_flight, slot_freed = 0, start
    engine.reset_step_timings()

    def finish(r: Request) -> None:
        nonlocal in_flight, slot_freed
        in_flight -= 1
        slot_freed = time.perf_counter()
        if on_finish is not None:
            on_finish(r)

    with torch.inference_mode():
        while pending or engine.has_unfinished_requests():
            now = time.perf_counter()
            while pending and (max_concurrency is None or in_flight < max_concurrency) \
                    and pending[0].arrival_offset <= now - start:
                r = pending.popleft()
                if not r.finished:          # not aborted before it arrived
                    r.arrival_time = min(now, max(start + r.arrival_offset, slot_freed))
                    if engine.add_request(r):
                        in_flight += 1
                        continue
                if on_finish is not None:   # aborted, or it can never fit the pool (r.error)
                    on_finish(r)
            if not engine.has_unfinished_requests():
                if pending and (max_concurrency is None or in_flight < max_concurrency):
                    time.sleep(max(0.0, pending[0].arrival_offset - (now - start)))
                continue
            for r in engine.step() + engine.pop_aborted():
                finish(r)
            if on_step is not None:
                on_step(engine)
            for r in engine.pop_aborted():
                finish(r)
