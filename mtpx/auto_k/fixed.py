"""The fixed draft-length policy: every step proposes num_speculative_tokens drafts."""
from collections import Counter

from mtpx.core.step_plan import StepPlan, StepRecord, StepView


class FixedDraftLength:
    """Every step proposes k drafts (0: plain decoding), every request at depth k (StepPlan);
    histogram: {k: steps with decodes}."""

    def __init__(self, k: int):
        self.max_k = self.k = k
        self.histogram: Counter = Counter()

    def plan(self, view: StepView) -> StepPlan:
        admitted = []
        for c in view.waiting:
            if not view.admit(self.k if c.first else c.depth, 0):
                break
            admitted.append(self.k if c.first else c.depth)
        return StepPlan(self.k, tuple(admitted))

    def observe(self, record: StepRecord) -> None:
        self.histogram.update([record.k] if record.rounds else [])
