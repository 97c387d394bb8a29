"""Progress without a terminal: when stderr is not a TTY (nohup, a pipe, CI, a cluster job) the
live progress bars draw nothing, so eval, bench, train and distill print one plain line every
MTPX_PROGRESS_S seconds (default 30; 0 turns the lines off) instead:

    eval mtp8: 12/64 requests, 312 tok/s, acceptance length 2.41, 41 s elapsed, ETA 2m53s
"""
from __future__ import annotations

import os
import sys
import time

ENV = "MTPX_PROGRESS_S"
DEFAULT_EVERY_S = 30.0


def progress_every_s() -> float:
    """Seconds between lines from MTPX_PROGRESS_S (default 30). Raises ValueError naming it when
    it is not a number >= 0."""
    raw = os.environ.get(ENV)
    if raw is None or raw == "":
        return DEFAULT_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{ENV}={raw!r}: give the seconds between progress lines (a number >= 0; "
                         "0 = no lines)")
    return value


def duration_text(seconds: float) -> str:
    """"41 s", "2m53s", "1h04m"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressLines:
    """label, total (items of `unit`, e.g. requests or steps), start (items already done, e.g.
    a resumed run: not counted in the rate). `update(done, *fields)` records progress and prints
    "{label}: done/total unit, fields..., elapsed, ETA" on `stream` when `every` seconds have passed
    since the last line; `tick()` prints the last state when due (call it where nothing finishes
    for long). Silent on a terminal (the live bar shows the same) and with every = 0; stream
    default sys.stderr, every default progress_every_s()."""

    def __init__(self, label: str, total: int, unit: str, start: int = 0, every: float | None = None,
                 stream=None, clock=time.perf_counter):
        self.stream = sys.stderr if stream is None else stream
        self.every = progress_every_s() if every is None else every
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = self.every > 0 and not (isatty is not None and isatty())
        self.label, self.total, self.unit, self.start = label, total, unit, start
        self.clock = clock
        self.t0 = self.last = clock()
        self.done, self.extra = start, ""

    def update(self, done: int, *fields: str | None) -> None:
        """done: items finished so far (start included); fields: texts such as "312 tok/s", in
        order (None: left out)."""
        self.done = done
        self.extra = "".join(f", {f}" for f in fields if f)
        self.tick()

    def tick(self) -> None:
        if self.enabled and self.clock() - self.last >= self.every:
            self.print_line()

    def print_line(self) -> None:
        now = self.clock()
        self.last = now
        elapsed = now - self.t0
        new = self.done - self.start
        eta = (f", ETA {duration_text(elapsed / new * (self.total - self.done))}"
               if new > 0 and self.done < self.total else "")
        print(f"{self.label}: {self.done}/{self.total} {self.unit}{self.extra}, "
              f"{duration_text(elapsed)} elapsed{eta}",
              file=self.stream, flush=True)
