"""The cost curve of automatic k over k (scheduler side, no torch): smoothing the calibrated step
costs (mtpx/auto_k/policy.py's module doc) and the running median of its online corrections."""
from __future__ import annotations

import statistics
from collections import deque

__all__ = ["smooth_step_costs", "RunningMedian", "running_median", "StepMemo"]


def smooth_step_costs(values: list[float]) -> list[float]:
    """Calibrated step ms for k = 0 .. max_k -> the model's costs (module doc): k = 0 as measured
    (no window, no draft loop); for k >= 1, with 3 or more of them, Tukey's running median of 3
    with his end-point rule (`_running_median`), so that one noisy k, low or high, takes its
    neighbours' level while the curve keeps its measured shape (a least-squares quadratic, used
    before, lifted the batch-64 k = 1 step from 401 to 485 ms on the demo because k = 7-8 rise
    faster than k = 1-6: experiments/concurrency/explore); then at least k = 0's (a step with drafts
    never costs less than one without) and non-decreasing (pool adjacent violators)."""
    if len(values) - 1 >= 3:
        values = [values[0]] + [max(values[0], v) for v in _running_median(values[1:])]
    return _non_decreasing(values)


def _running_median(ys: list[float]) -> list[float]:
    """Tukey's running median of 3 (3 or more values; Tukey 1977, Exploratory Data Analysis, ch.
    7): each inner value the median of itself and its two neighbours; the first the median of
    itself, its smoothed neighbour and the line through the next two smoothed values extended one
    step (his end-point rule: y_1 = med(y_1, z_2, 3 z_2 - 2 z_3)); the last as measured (the step
    cost is convex in k, so a high last value is likely real, and non-decreasing lifts a low one)."""
    def med(a, b, c):
        return sorted((a, b, c))[1]

    z = [ys[0]] + [med(ys[i - 1], ys[i], ys[i + 1]) for i in range(1, len(ys) - 1)] + [ys[-1]]
    z[0] = med(ys[0], z[1], 3 * z[1] - 2 * z[2])
    return z


def _non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of values (pool adjacent violators)."""
    if all(a <= b for a, b in zip(values, values[1:])):
        return list(values)                        # already non-decreasing: itself
    blocks: list[list[float]] = []                 # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    return [s / n for s, n in blocks for _ in range(n)]


def _interpolate(known: list[tuple[int, float]], k: int, default: float) -> float:
    """The ratio at k from [(k, ratio)] sorted by k: linear between two, the nearest's beyond
    them, default without any."""
    if not known:
        return default
    if k <= known[0][0]:
        return known[0][1]
    for (k0, r0), (k1, r1) in zip(known, known[1:]):
        if k <= k1:
            return r0 + (r1 - r0) * (k - k0) / (k1 - k0)
    return known[-1][1]


def _interpolate_all(known: list[tuple[int, float]], n: int, default: float) -> list[float]:
    """[_interpolate(known, k, default) for k in range(n)] (the same arithmetic), in one pass."""
    if not known:
        return [default] * n
    out, i, last = [], 0, len(known) - 1
    for k in range(n):
        if k <= known[0][0]:
            out.append(known[0][1])
            continue
        while i < last and k > known[i + 1][0]:
            i += 1
        if i == last:
            out.append(known[-1][1])
        else:
            (k0, r0), (k1, r1) = known[i], known[i + 1]
            out.append(r0 + (r1 - r0) * (k - k0) / (k1 - k0))
    return out


class RunningMedian:
    """The median of the last `window` values added (of all of them while fewer), and how many were
    added (`count`): the online cost corrections (mtpx/auto_k/policy.py). A median, not a mean:
    a running engine's dear decode steps come in streaks of a few (1.35-2x the median step:
    experiments/concurrency/window_layout/k7_steps.py), and an EMA of weight 0.1 that a streak
    carried up by 40% stuck there. A k whose last steps were dear is not chosen again to revise
    them, so the policy also lets a stale value fade (`at`; cost_learning._known_ratios)."""

    __slots__ = ("recent", "count", "value", "at")

    def __init__(self, window: int):
        self.recent: deque[float] = deque(maxlen=max(1, window))
        self.count, self.value, self.at = 0, 0.0, 0

    def add(self, x: float, at: int = 0) -> None:
        """Add x, observed at step `at` (the caller's step count: how stale the value is)."""
        self.recent.append(x)
        self.count += 1
        self.value, self.at = statistics.median(self.recent), at

    def __eq__(self, other) -> bool:
        return (isinstance(other, RunningMedian) and self.recent.maxlen == other.recent.maxlen
                and (self.recent, self.count, self.value, self.at)
                == (other.recent, other.count, other.value, other.at))

    def __repr__(self) -> str:
        return (f"RunningMedian(value={self.value}, count={self.count}, at={self.at}, "
                f"recent={list(self.recent)})")


def running_median(table: dict, key, value: float, window: int, at: int = 0) -> None:
    """table[key] (a RunningMedian of `window` values, created on first use) updated with value,
    observed at step `at`."""
    if key not in table:
        table[key] = RunningMedian(window)
    table[key].add(value, at)


class StepMemo(dict):
    """What automatic k computes from its cost state (a cost curve per batch size, ...), kept
    for the step count `at` until that state changes (StepCostLearning._memo): one step's
    decisions and learning ask for the same curves several times (experiments/concurrency/
    host_work). A cache, not state: equal to any other StepMemo, so a query leaves the policy
    equal to what it was."""

    def __init__(self):
        super().__init__()
        self.at = 0

    def __eq__(self, other) -> bool:
        return isinstance(other, StepMemo)

    __hash__ = None
