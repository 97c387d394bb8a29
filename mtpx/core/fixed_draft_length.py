"""The decisions of a draft-length policy (`StepChoice`, `DepthChoice`) and the fixed policy
(`FixedDraftLength`: every step proposes num_speculative_tokens drafts). The automatic one, and
the interface both share, is mtpx/core/draft_length.py's `AutoDraftLength`."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["StepChoice", "DepthChoice", "FixedDraftLength"]


@dataclass(frozen=True)
class StepChoice:
    """One step's decision (`decide`): k drafts to propose; k_in_use, steps, probes, switch_streak
    and explored (the step of the last exploring probe): the policy's state once it is committed
    (None: nothing to commit); step_ms, explore_ms: the step's predicted cost and the part of it
    that exploring spends (AutoDraftLength's `explore_budget`); rising_to: the larger k a switch
    streak heads for (0: none); predicted: (batch size, k, cost ms at k, at 0) the step was chosen
    with (the cost-model log's); settled: (key, step) of the full decision that settled the k in
    use, which this one holds or is (None: not settled; mtpx/core/settled.py)."""

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
    (key, step) of the full vote that settled a running depth (mtpx/core/settled.py)."""

    depth: int
    current: int | None = None
    streak: tuple[int, int] | None = None
    explore_ms: float = 0.0
    step_ms: float = 0.0
    settled: tuple | None = None


class FixedDraftLength:
    """Every step proposes k drafts (0: plain decoding). histogram: {k: steps with decodes}."""

    auto = False
    per_request = False

    def __init__(self, k: int):
        self.max_k = self.k = k
        self.histogram: Counter = Counter()

    def decide(self, batch_size: int, max_k: int | None = None, held: int = 0, depths=None) -> StepChoice:
        return StepChoice(self.k)

    def choose(self, batch_size: int, max_k: int | None = None) -> int:
        return self.k

    def commit(self, choice: StepChoice) -> None:
        pass

    def decide_depth(self, batch_size: int, current: int | None = None, ages=None, depths: list[int] | None = None,
                     prompt_tokens: int = 0, max_tokens: int | None = None) -> DepthChoice:
        return DepthChoice(self.k, current)

    def depth(self, batch_size: int, current: int | None = None, depths: list[int] | None = None,
              prompt_tokens: int = 0, max_tokens: int | None = None) -> int:
        return self.k

    def commit_depth(self, choice: DepthChoice) -> None:
        pass

    def record_depth(self, depth: int) -> None:
        pass

    def reset_histograms(self) -> None:
        self.histogram.clear()

    def observe(self, num_draft_tokens: int, num_accepted: int, key=None, age: int | None = None) -> None:
        pass

    def forget(self, key) -> None:
        pass

    def observe_step(self, k: int, batch_size: int, step_ms: float, num_tokens: int | None = None,
                     verify_ms: float | None = None, draft_depth: int | None = None) -> None:
        pass

    def observe_parts(self, verified: int, proposed: int, batch_size: int, verify_ms: float, draft_ms: float) -> None:
        pass

    def observe_overhead(self, batch_size: int, ms: float) -> None:
        pass

    def observe_prefill(self, module_tokens: int, ms: float) -> None:
        pass

    def set_prefill_cost(self, ms_per_module_token: float) -> None:
        pass

    def record(self, k: int, batch_size: int | None = None, ages=None) -> None:
        self.histogram[k] += 1
