"""What an engine's compilation is doing, while it does it, and where its compiled code is kept.

Compiling a decode graph takes seconds to a minute on a CPU. `CompileProgress` shows each graph
being built: on a terminal a live line (rich) naming the graph, its number of the expected
total and the elapsed seconds; without one (nohup, a pipe, CI, a cluster job) a line when a
graph starts, one every `interval` seconds while it builds, and one when it is done. Every
finished graph is kept in `records` (name, seconds, compiled or loaded from the cache).

Compiled code is kept between runs in Inductor's FX graph and AOTAutograd caches under
$MTPX_CACHE_DIR/inductor (`use_cache_dir`), so a second run of the same settings, a multirun's
later jobs and the lossless check's plain engine load their graphs instead of compiling them.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch._dynamo.callback import callback_handler
from torch._dynamo.utils import counters

from mtpx.io import mtpx_cache_dir



def use_cache_dir() -> str:
    """Point Inductor's caches at $MTPX_CACHE_DIR/inductor unless the user set
    TORCHINDUCTOR_CACHE_DIR (then that one is used); returns the directory. Inductor keys every
    entry on the graph, the torch version and its configuration, so settings never share a wrong
    entry."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # Inductor writes its default into the environment on first use: that one is not the user's
    if not current or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(mtpx_cache_dir() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


@dataclass
class _Frame:
    """A compiled call in progress (CompileProgress.call)."""

    progress: "CompileProgress"
    name: str
    number: int
    t0: float
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    verb: str = "building"          # "loading" for a saved graph read back


_calls: list[_Frame] = []      # the compiled calls in progress, innermost last


@callback_handler.register_start_callback
def _on_compile_start(args) -> None:
    """Dynamo starts compiling inside a reported call: show it (once per call)."""
    if not _calls or _calls[-1].thread is not None or not _calls[-1].progress.enabled:
        return
    f = _calls[-1]
    f.thread = threading.Thread(target=f.progress._watch, args=(f.name, f.number, f.t0, f.stop, f.verb),
                                daemon=True)
    f.thread.start()


def _cache_counts() -> tuple[int, int]:
    c = counters["inductor"]
    return c["fxgraph_cache_hit"], c["fxgraph_cache_miss"]


class CompileProgress:
    """Reports the graphs one engine builds (module doc). expected: the graphs the engine is
    expected to build (the total shown; raised when more come); stream: where lines go (stderr);
    live: a rich live line (None: when stream is a terminal); interval: seconds between lines
    without a terminal; enabled False: record only, print nothing."""

    def __init__(self, expected: int, stream=None, live: bool | None = None, interval: float = 30.0,
                 enabled: bool = True):
        self.expected, self.interval, self.enabled = expected, interval, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.records: list[dict] = []

    def _line(self, text: str) -> None:
        print(f"engine.compile: {text}", file=self.stream, flush=True)

    def _record(self, name: str, seconds: float, source: str, count: int = 1) -> None:
        for _ in range(count):
            self.records.append({"graph": name, "seconds": round(seconds / count, 3), "source": source})
        self.expected = max(self.expected, len(self.records))
        if self.enabled:
            verb = "loaded from the cache" if source == "loaded" else "compiled"
            self._line(f"{name}: {verb} in {seconds:.1f} s (graph {len(self.records)} of {self.expected})")

    @contextmanager
    def _frame(self, name: str, start_now: bool, verb: str = "building"):
        frame = _Frame(self, name, len(self.records) + 1, time.perf_counter(), verb=verb)
        _calls.append(frame)
        if start_now and self.enabled:
            _on_compile_start(None)
        try:
            yield frame
        finally:
            _calls.pop()
            if frame.thread is not None:
                frame.stop.set()
                frame.thread.join()

    @contextmanager
    def call(self, name: str):
        """Around one call of a torch.compile'd function named `name`: if it builds a graph
        (Dynamo's unique graph count grows) the graph is recorded and reported, as compiled or
        loaded from Inductor's cache. The live report starts when Dynamo starts compiling (its
        compile-start callback starts a thread), so a call that only runs compiled code costs a
        few microseconds here."""
        before = counters["stats"]["unique_graphs"]
        hits0, misses0 = _cache_counts()
        with self._frame(name, start_now=False) as frame:
            yield
        new = counters["stats"]["unique_graphs"] - before
        if new > 0:
            hits, misses = _cache_counts()
            source = "loaded" if hits > hits0 and misses == misses0 else "compiled"
            self._record(name, time.perf_counter() - frame.t0, source, new)

    @contextmanager
    def build(self, name: str, source: str):
        """Around building one graph (`source` "compiled" or "loaded", from a saved file): shown
        from the start, recorded at the end if it succeeds."""
        with self._frame(name, start_now=True, verb="loading" if source == "loaded" else "building") as frame:
            yield
        self._record(name, time.perf_counter() - frame.t0, source)

    def _watch(self, name: str, number: int, t0: float, stop: threading.Event,
               verb: str = "building") -> None:
        total = max(self.expected, number)
        if self.live:
            from rich.console import Console
            console = Console(file=self.stream)
            with console.status(f"engine.compile: {verb} {name} (graph {number} of {total})") as status:
                while not stop.wait(0.2):
                    status.update(f"engine.compile: {verb} {name} (graph {number} of {total}), "
                                  f"{time.perf_counter() - t0:.0f} s")
            return
        self._line(f"{verb} {name} (graph {number} of {total}) ...")
        while not stop.wait(self.interval):
            self._line(f"still {verb} {name} (graph {number} of {total}), {time.perf_counter() - t0:.0f} s")

    def summary(self) -> dict:
        """{"num_graphs", "num_compiled", "num_loaded", "compile_s", "graphs": records}."""
        compiled = sum(r["source"] == "compiled" for r in self.records)
        return {"num_graphs": len(self.records), "num_compiled": compiled,
                "num_loaded": len(self.records) - compiled,
                "compile_s": round(sum(r["seconds"] for r in self.records), 3), "graphs": list(self.records)}
