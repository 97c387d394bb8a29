"""The decisions automatic k computes before committing them (`StepChoice`, `DepthChoice`):
queries return them, `commit` and `commit_depth` apply them."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepChoice", "DepthChoice"]


@dataclass(frozen=True)
class StepChoice:
    """One step's decision (`decide`): k drafts to propose; k_in_use, steps, probes, switch_streak
    and explored (the step of the last exploring probe): the policy's state once it is committed
    (None: nothing to commit); step_ms, explore_ms: the step's predicted cost and the part of it
    that exploring spends (AutoDraftLength's `explore_budget`); rising_to: the larger k a switch
    streak heads for (0: none); predicted: (batch size, k, cost ms at k, at 0) the step was chosen
    with (the cost-model log's); settled: (key, step) of the full decision that settled the k in
    use, which this one holds or is (None: not settled; mtpx/auto_k/settled.py)."""

    k: int
    k_in_use: int | None = None
    steps: int | None = None
    probes: int | None = None
    switch_streak: int | None = None
    explored: int | None = None
    step_ms: float = 0.0
    explore_ms: float = 0.0
    rising_to: int = 0
    predicted: tuple | None = None
    settled: tuple | None = None


@dataclass(frozen=True)
class DepthChoice:
    """A depth decision (`decide_depth`): the depth; current: the running depth asked about
    (None: an admission); streak: (step, steps in a row) of the vote to count for current, or
    None when there is nothing to count; explore_ms: an admission's module prefill beyond the
    depth it would get without exploring (AutoDraftLength's `explore_budget`); step_ms: the
    predicted step at the admission's batch size, the budget's window before any step; settled:
    (key, step) of the full vote that settled a running depth (mtpx/auto_k/settled.py)."""

    depth: int
    current: int | None = None
    streak: tuple[int, int] | None = None
    explore_ms: float = 0.0
    step_ms: float = 0.0
    settled: tuple | None = None
