"""The life of an HTTP request's runs in the engine loop (mtpx/serve/async_engine.py): run to
their end, or streamed as text deltas.

A client that disconnects aborts its requests, streamed or not: `run_all` awaits the
http.disconnect (it does not poll), so the engine runs at most the step in progress for it, and
closing a stream's iterator (Starlette does when the client leaves) aborts every run in it.
Stream deltas concatenate to the non-streamed text (mtpx/serve/detokenize.py: text that may
still be a stop string is held back).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request

from mtpx.serve.async_engine import AsyncEngine, Update
from mtpx.serve.detokenize import IncrementalText
from mtpx.serve.errors import BadRequest, ClientGone
from mtpx.serve.parsing import Run
from mtpx.serve.protocol import SamplingFields
from mtpx.serve.responses import Formatter


class Runner:
    """Submits runs to `engine` and reads their updates; `formatter` decodes their text."""

    def __init__(self, engine: AsyncEngine, formatter: Formatter):
        self.engine, self.formatter = engine, formatter

    async def run_one(self, run: Run) -> Update:
        """The run's last (finished) update; BadRequest when the engine refuses or fails it."""
        last = None
        try:
            async for u in self.engine.generate(run.ids, run.sp, run.arrival_time, run.first_of_prompt,
                                                not run.echo_only):
                last = u
        except ValueError as e:
            raise BadRequest(str(e), "prompt") from None
        if last.error:
            raise BadRequest(last.error)
        return last

    async def run_all(self, request: Request, runs: list[Run]) -> list[Update]:
        """Every run to its end; a client that disconnects first aborts them all (ClientGone) at
        once: its http.disconnect is awaited, not polled, so the engine runs at most the step in
        progress for it."""
        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        task = asyncio.ensure_future(asyncio.gather(*(self.run_one(r) for r in runs)))
        gone = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            raise ClientGone()
        finally:
            for t in (task, gone):
                if not t.done():
                    t.cancel()
            await asyncio.gather(task, gone, return_exceptions=True)

    async def stream_updates(self, run: Run, body: SamplingFields) -> AsyncIterator[tuple]:
        """(text delta, token ids, logprob entries, update) per engine update of `run` that has
        text to send or finishes; tokens whose text is held back ride on the next one. A failed
        request ends it as (None, [], None, update)."""
        text = IncrementalText(run.sp.stop, body.include_stop_str_in_output)
        sent_ids = 0
        async for u in self.engine.generate(run.ids, run.sp, run.arrival_time, run.first_of_prompt,
                                            not run.echo_only):
            if u.error:
                yield None, [], None, u
                return
            out = self.formatter.output_text(run, u, body)
            delta = text.delta(out, u.finished, u.stop_reason, self.formatter.stop_after(run, u, body, out))
            if delta or u.finished:
                lps = u.logprobs[sent_ids:] if u.logprobs is not None else None
                yield delta, u.token_ids[sent_ids:], lps, u
                sent_ids = len(u.token_ids)

    async def merged(self, runs: list[Run], body: SamplingFields) -> AsyncIterator[tuple[Run, tuple]]:
        """stream_updates of every run, interleaved as they come; closing it aborts them all."""
        if len(runs) == 1:
            async for item in self.stream_updates(runs[0], body):
                yield runs[0], item
            return
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(run: Run) -> None:
            try:
                async for item in self.stream_updates(run, body):
                    await queue.put((run, item))
            finally:
                queue.put_nowait((run, done))

        tasks = [asyncio.ensure_future(pump(r)) for r in runs]
        try:
            left = len(tasks)
            while left:
                run, item = await queue.get()
                if item is done:
                    left -= 1
                    continue
                yield run, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
