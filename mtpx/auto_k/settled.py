"""Settled decisions, the part of automatic k that spares a steady engine its per-step decisions
(policy.py's module doc, "Settled"): a full decision that keeps the k in use with no switch
streak, rise or probe holds for the next interval - 1 steps under the same key (batch size,
depths, k in use), a probe's step excepted, and so does a running depth's vote to stay. An
object AutoDraftLength holds (`settled`); it owns the last settled decisions. Why: deciding anew
cost a compiled concurrency-1 step about 1% of its time for the same answer (docs/results.md)."""
from __future__ import annotations

from mtpx.auto_k.choices import DepthChoice, StepChoice

__all__ = ["SettledDecisions"]


class SettledDecisions:
    """interval: steps a settled decision holds (1: none)."""

    def __init__(self, interval: int):
        self.interval = max(1, interval)
        self.clear()

    def __eq__(self, other) -> bool:      # a policy's state compares by value (copies in tests)
        return isinstance(other, SettledDecisions) and vars(self) == vars(other)

    def clear(self) -> None:
        """Forget the settled decisions: the next ones are full."""
        self.step: StepChoice | None = None           # the last full decision that settled the k
        self.depths: dict[int, tuple] = {}             # depth -> (key, step) of its last settled vote

    def held_step(self, key: tuple, steps: int, probes: int, explored: int,
                  probe_interval: int) -> StepChoice | None:
        """Step `steps`'s decision when a full decision under the same key kept the k in use less
        than interval steps before and the step is no probe's (probe_interval), carrying the
        policy's probe count and last exploring step: that decision again (None: decide anew)."""
        s = self.step
        if s is None or s.settled[0] != key or steps - s.settled[1] >= self.interval \
                or probe_interval and steps % probe_interval == 0:
            return None
        return StepChoice(s.k, s.k_in_use, steps, probes, 0, explored, s.step_ms, s.explore_ms, 0,
                          s.predicted, s.settled)

    def settles(self, key: tuple, steps: int, k: int, current: int, streak: int, rising_to: int,
                ages) -> tuple | None:
        """The settled field of a full decision: (key, steps) when it keeps the k in use with no
        switch streak, rise or probe, for the engine-wide age mix (ages None), else None."""
        if self.interval > 1 and ages is None and k == current and not streak and not rising_to:
            return key, steps
        return None

    def held_depth(self, current: int, key: tuple, steps: int) -> DepthChoice | None:
        """A running depth's vote to stay when a full vote under the same key (batch size, depth,
        k in use, rise) kept it less than interval steps before (None: decide anew)."""
        s = self.depths.get(current)
        if s is None or s[0] != key or steps - s[1] >= self.interval:
            return None
        return DepthChoice(current, current, (steps, 0), settled=s)

    def commit(self, choice: StepChoice) -> None:
        """A committed step decision: it settles the k, or ends the settled one."""
        self.step = choice if choice.settled is not None else None

    def commit_depth(self, choice: DepthChoice) -> None:
        """A committed running depth's vote: it settles the depth, or ends its settled vote."""
        if choice.settled is not None:
            self.depths[choice.current] = choice.settled
        else:
            self.depths.pop(choice.current, None)
