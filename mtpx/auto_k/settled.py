"""Settled decisions, the part of automatic k that spares a steady engine its per-step decisions
(scheduler side, no torch). A mixin of AutoDraftLength (mtpx/auto_k/policy.py), whose module
doc gives the rule; it owns no state of its own (AutoDraftLength.reset creates it).

Why: at compiled concurrency 1 the demo's decode step takes about 13 ms, and deciding its k and
its request's depth anew took about 0.11 ms of it, mostly cache misses after the forward; the
answer was the k in use in 97% of the steps (experiments/concurrency/settled)."""
from __future__ import annotations

from mtpx.auto_k.choices import DepthChoice, StepChoice

__all__ = ["SettledDecisions"]


class SettledDecisions:
    """The held step and depth decisions between two full ones (AutoDraftLength, "Settled")."""

    def _held_step(self, key: tuple, steps: int) -> StepChoice | None:
        """Step `steps`'s decision when a full decision under the same key (batch size, deepest
        depth, held depth, depths, k in use) kept the k in use less than settled_interval steps
        before and the step is no probe's: that decision again (None: decide anew)."""
        s = self._settled
        if s is None or s.settled[0] != key or steps - s.settled[1] >= self.settled_interval \
                or self.probe_interval and steps % self.probe_interval == 0:
            return None
        return StepChoice(s.k, s.k_in_use, steps, self._probes, 0, self._explored, s.step_ms, s.explore_ms, 0,
                          s.predicted, s.settled)

    def _settles(self, key: tuple, steps: int, k: int, current: int, streak: int, rising_to: int,
                 ages) -> tuple | None:
        """The settled field of a full decision: (key, steps) when it keeps the k in use with no
        switch streak, rise or probe, for the engine-wide age mix (ages None), else None."""
        if self.settled_interval > 1 and ages is None and k == current and not streak and not rising_to:
            return key, steps
        return None

    def _held_depth(self, current: int, key: tuple) -> DepthChoice | None:
        """A running depth's vote to stay when a full vote under the same key (batch size, depth,
        k in use, rise) kept it less than settled_interval steps before (None: decide anew)."""
        s = self._settled_depths.get(current)
        if s is None or s[0] != key or self._steps - s[1] >= self.settled_interval:
            return None
        return DepthChoice(current, current, (self._steps, 0), settled=s)

    def _unsettle(self) -> None:
        """Forget the settled decisions: the next ones are full."""
        self._settled: StepChoice | None = None           # the last full decision that settled the k
        self._settled_depths: dict[int, tuple] = {}       # depth -> (key, step) of its last settled vote
