"""A plain stretch, the part of automatic k that spares a step of plain decoding its policy work
(issue 72; docs/automatic_k.md, "A plain stretch"). When the k in use is settled at 0 (no switch
streak, no rise), every running request is at depth 0, none waits to be admitted and the policy
is neither forced nor per-request, the step's k is 0 whatever the estimates say: a request drafts
at most its depth, so no k > 0, probe or exploring probe is possible (`decide` with top = 0).
Such a step decides nothing: it advances the step and probe counts and the exploring budget's
clock as a full decision would, with the predicted step ms of the stretch's last learning step.
It learns k = 0's cost (the running medians of cost_learning.py: the level, k = 0's shape and
parts, the overhead) from one step in `settled_interval` only, as settled decisions hold a
decision that long: the medians of cost_window values then span settled_interval times as many
steps of the same steady plain decoding. Every step still counts in the histograms, the
acceptance decay and age mix, the predicted-vs-measured log and the run's measured decode. With
settled_interval 1 a plain stretch leaves the policy exactly as full decisions do
(tests/test_plain_stretch.py).

Why: at eager concurrency 64 the policy's plan and observe cost a step of plain decoding's work
0.24 ms, 0.64% of it (experiments/auto_k_never_loses, section 4)."""
from __future__ import annotations

from mtpx.core.step_plan import StepPlan, StepRecord, StepView

__all__ = ["PlainStretch"]


class PlainStretch:
    """The plain stretch of an AutoDraftLength `p` (module doc), an object it holds
    (`plain_stretch`) and calls first in plan and observe. enabled: False runs every step's full
    decision (tests compare the two). Owns the stretch's predicted costs."""

    def __init__(self):
        self.enabled = True
        self.clear()

    def __eq__(self, other) -> bool:      # a policy's state compares by value (copies in tests)
        return isinstance(other, PlainStretch) and vars(self) == vars(other)

    def clear(self) -> None:
        """End the stretch: the next plain step computes its predicted costs anew."""
        self.active = False          # the step planned last was a plain stretch's
        self.batch_size = 0          # the batch size of the predicted costs below (0: none)
        self.step_ms = 0.0           # step_cost_curve(batch_size)[0]: the exploring budget's clock
        self.predicted: tuple | None = None    # StepChoice.predicted of a k = 0 step at batch_size
        self.calibrated_ms = 0.0     # the calibration's k = 0 step at batch_size

    def plan(self, p, view: StepView) -> StepPlan | None:
        """The step's plan when it is a plain stretch's (module doc), else None (the full decision
        follows; the stretch ends)."""
        depths = view.running_depths
        if not self.enabled or p.k or p._switch_streak or p._rising_to or p.forced is not None \
                or p.per_request or p.step_costs is None or not view.depth_per_request or view.waiting \
                or not depths or any(depths):
            self.clear()
            return None
        for key in view.removed:
            p.forget(key)
        B, steps = len(depths), p._steps + 1
        p._lower_streak[0] = (p._steps, 0)        # the depth-0 vote a full step casts (decide_depth)
        p.settled.depths.pop(0, None)
        if B != self.batch_size or self._learns(p, steps):     # the costs the stretch predicts with
            cost, self.batch_size = p.costs.cost_curve(B)[0], B
            self.step_ms, self.predicted = p.costs.step_cost_curve(B)[0], (B, 0, cost, cost)
            self.calibrated_ms = p.costs.calibrated_cost(0, B)
        if p.probe_interval and steps % p.probe_interval == 0:
            p._probes += 1                        # a probe's step: no k to probe below depth 0
        p._steps, p._switch_streak, p._rising_to = steps, 0, 0
        p.settled.step = None                     # the next full decision decides anew
        p.costs.prediction = self.predicted
        p.exploring.budget.step(self.step_ms, 0.0)
        p._planned = (True, None)
        self.active = True
        return StepPlan(0)

    @staticmethod
    def _learns(p, steps: int) -> bool:
        """Whether the stretch's step `steps` learns k = 0's cost (one in settled_interval)."""
        return steps % p.settled.interval == 0

    def observe(self, p, record: StepRecord) -> bool:
        """Learn from a plain stretch's step (module doc); False: not one (or one whose record
        holds a prefill, module work or no timing), which the full `observe` learns from."""
        rounds = record.rounds
        if not self.active or record.k or record.has_prefills or not record.timed or not rounds \
                or record.prefill_module_tokens or record.catch_up_module_tokens \
                or len(rounds) != self.batch_size or self._learns(p, p._steps):
            return False
        B = self.batch_size
        p.histogram[0] += 1
        log = p.costs.cost_log
        log.count_decode_step(B)
        p.estimates.decay()
        mix = p.estimates.mix([r.age for r in rounds])
        old, f = p.age_mix or [1 / len(mix)] * len(mix), p.decay
        p.age_mix = [f * a + (1 - f) * n / B for a, n in zip(old, mix)]
        num_tokens = sum([r.num_tokens for r in rounds])
        decode_ms = 1e3 * (record.verify_s + record.draft_s + record.catch_up_s)
        predicted = self.predicted
        log.add(0, B, 1.0, predicted[2], predicted[3], self.calibrated_ms, num_tokens,
                1e3 * (record.verify_s + record.draft_s))
        log.add_decode(num_tokens, decode_ms)
        return True
