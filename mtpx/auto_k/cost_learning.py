"""The step-cost model of automatic k (scheduler side, no torch): the calibrated decode-step costs
smoothed over k, their online corrections from the running engine's pure decode steps, the
module prefill's cost, and the predicted-vs-measured log. An object AutoDraftLength holds
(`costs`, mtpx/auto_k/policy.py, whose module doc gives the rules); it owns its state."""
from __future__ import annotations

import bisect

from collections import deque

from mtpx.auto_k.cost_curve import (RunningMedian, StepMemo, _interpolate, _interpolate_all, _non_decreasing,
                                  running_median, smooth_step_costs)
from mtpx.auto_k.cost_model_log import CostModelLog, batch_bucket
from mtpx.auto_k.request_k import Allocation

__all__ = ["StepCosts", "with_prefill"]


def with_prefill(g: list[float], extra: list[float]) -> list[float]:
    """Goodputs (tokens per ms) with extra[k] ms added to each token's cost at k: an admitted
    request's module prefill spread over its output tokens (AutoDraftLength.decide_depth)."""
    return [1 / (1 / x + e) if x > 0 else x for x, e in zip(g, extra)]


class StepCosts:
    """Step costs and their corrections (module doc): set_step_costs, cost_curve, step_cost_curve,
    calibrated_cost, cost_unlearned, set_prefill_cost, prefill_ms, and observe_step / observe_parts /
    observe_allocation / observe_overhead / observe_prefill, which learn from a measured step.
    max_k: drafts at most; config: AutoKConfig (cost_window, cost_decay, min_cost_observations,
    explore_costs); steps: the policy's step count (a shape fades per step; AutoDraftLength sets it);
    prediction: the committed step's StepChoice.predicted (`observe_step`)."""

    def __init__(self, max_k: int, config):
        self.max_k, self.cost_window, self.cost_decay = max_k, config.cost_window, config.cost_decay
        self.min_cost_observations, self.explore_costs = config.min_cost_observations, config.explore_costs
        self.step_costs: dict | None = None
        self._draft_costs: dict | None = None      # `set_draft_costs`
        self._draft_batches: list[int] = []
        self._prefill_prior: float | None = None   # `set_prefill_cost`
        self.reset()

    def __eq__(self, other) -> bool:      # a policy's state compares by value (copies in tests)
        return isinstance(other, StepCosts) and vars(self) == vars(other)

    def reset(self) -> None:
        """Forget what the running engine taught (not the calibrated costs, nor `set_prefill_cost`'s
        value); the step count starts again at 0."""
        self.steps = 0
        self.prediction: tuple | None = None
        # the cost corrections, each a RunningMedian of the last cost_window steps' values
        self.correction: dict[int, RunningMedian] = {}    # k -> measured / calibrated step cost (reported)
        self.every_k_correction = RunningMedian(self.cost_window)   # the level over every k (`factor`)
        self._level_keys: deque = deque(maxlen=max(1, self.cost_window))   # its steps' (k, bucket)s
        self.bucket_correction: dict[tuple[int, int], RunningMedian] = {}      # (k, bucket) -> ratio
        self.part_correction: dict[tuple[str, int, int], RunningMedian] = {}   # (part, k, bucket) -> ratio
        self.overhead: dict[int, RunningMedian] = {}  # batch bucket -> ms a step costs beyond its forwards
        self.cost_log = CostModelLog()               # predicted vs measured, per batch bucket
        self._cost_memo = StepMemo()                 # this step's cost curves (`_memo`)
        self.prefill_module_ms = self._prefill_median()   # a prefill's draft modules: ms per token x module
        self.catch_up_module_ms = RunningMedian(self.cost_window)  # the lazy catch-up's, likewise

    def set_step_costs(self, step_costs: dict) -> None:
        batches = sorted({b for _, b in step_costs})
        missing = [(k, b) for b in batches for k in range(self.max_k + 1) if (k, b) not in step_costs]
        if missing:
            raise ValueError(f"step costs miss (k, batch size) {missing[:4]}: calibrate every k in "
                             f"0..{self.max_k} at each batch size (spec.cost_model_file)")
        costs = {}
        for b in batches:
            for k, ms in enumerate(smooth_step_costs([step_costs[(k, b)] for k in range(self.max_k + 1)])):
                costs[(k, b)] = ms
        self.step_costs, self._batches, self._calibrated_by_batch = costs, batches, StepMemo()
        self._costs_changed()

    def set_draft_costs(self, draft_costs: dict) -> None:
        """The calibration's draft rounds, {(k, batch size): ms} (auto_k.costs.calibrate_step_costs;
        {}: none): what `draft_cost` prices a depth's draft round at before one is measured
        online. Kept by reset. Raises ValueError when they miss a k at one of their batch sizes."""
        batches = sorted({b for _, b in draft_costs})
        missing = [(k, b) for b in batches for k in range(self.max_k + 1) if (k, b) not in draft_costs]
        if missing:
            raise ValueError(f"draft costs miss (k, batch size) {missing[:4]}: "
                             f"give every k in 0..{self.max_k}")
        self._draft_costs = {kb: max(0.0, ms) for kb, ms in draft_costs.items()} if batches else None
        self._draft_batches = batches
        self._costs_changed()

    def _memo(self) -> StepMemo:
        """The cache of this step's cost curves (cost_curve.StepMemo), emptied when the step count
        moves on (a shape fades per step) or the cost state changes (`_costs_changed`)."""
        memo = self._cost_memo
        if memo.at != self.steps:
            memo.clear()
            memo.at = self.steps
        return memo

    def _costs_changed(self) -> None:
        """Called by every change of what the cost curves are computed from."""
        self._cost_memo.clear()

    def cost(self, k: int, batch_size: int) -> float:
        """Predicted step ms at k drafts and batch_size (module doc)."""
        return self.cost_curve(batch_size)[k]

    def cost_curve(self, batch_size: int) -> list[float]:
        """Predicted step ms at batch_size for k = 0 .. max_k: the calibrated costs times the
        online correction, made non-decreasing in k (pool-adjacent-violators) (module doc). The
        list is shared (`_memo`): read it, do not change it."""
        memo, key = self._memo(), ("curve", batch_size)
        if key not in memo:
            ratios = _interpolate_all(self._known_ratios(batch_size), self.max_k + 1, self.factor)
            memo[key] = _non_decreasing([r * c for r, c in zip(ratios, self._calibrated(batch_size))])
        return memo[key]

    def _known_ratios(self, batch_size: int) -> list[tuple[int, float]]:
        """[(k, measured / calibrated)] of the ks measured at batch_size's bucket: the level
        (`factor`) times k's shape there (`_learn_cost`), from `min_cost_observations` steady steps
        at k, else from as many steps verifying k and as many proposing k (`observe_parts`: the
        sum of the two parts' shapes); each shape faded toward 1 (the calibration's) by
        cost_decay per step since it was last measured. A k whose last steps were dear is no
        longer chosen, so nothing else would revise its shape; so it fades and is tried again, as
        an unverified draft position drifts back to its prior."""
        memo, key = self._memo(), ("known", batch_size)
        if key not in memo:
            bucket, factor, known = batch_bucket(batch_size), self.factor, []
            for k in range(self.max_k + 1):
                if (shape := self._known_shape((k, bucket))) is not None:
                    known.append((k, factor * shape))
            memo[key] = known
        return memo[key]

    def _fresh(self, shape: float, at: int) -> float:
        """A shape faded toward 1 by cost_decay per step since step `at`."""
        return 1 + (shape - 1) * self.cost_decay ** max(0, self.steps - at)

    def _known_shape(self, key: tuple[int, int]) -> float | None:
        """The faded shape of (k, batch bucket) from min_cost_observations steady steps, else from
        as many of both parts, else None (`_known_ratios`; `_learn_cost` divides by it, 1 for None)."""
        least = max(1, self.min_cost_observations)
        k, bucket = key
        steady = self.bucket_correction.get(key)
        if steady is not None and steady.count >= least:
            return self._fresh(steady.value, steady.at)
        v, d = self.part_correction.get(("verify", k, bucket)), self.part_correction.get(("draft", k, bucket))
        if v is not None and d is not None and min(v.count, d.count) >= least:
            return self._fresh(v.value + d.value, min(v.at, d.at))
        return None

    def observe_overhead(self, batch_size: int, ms: float) -> None:
        """A pure decode step of batch_size requests spent ms beyond its forwards: per batch
        bucket, the median of the last cost_window steps; the decisions add it to every k's cost
        (`step_cost_curve`)."""
        running_median(self.overhead, batch_bucket(batch_size), max(0.0, ms), self.cost_window)
        self._costs_changed()

    def observe_decode(self, record, pure: bool) -> None:
        """A timed decode step (StepRecord): the measured decode the run estimate compares with
        (cost_log.add_decode) and, when pure, its overhead beyond its forwards (`observe_overhead`)."""
        decode_s = record.verify_s + record.draft_s + record.catch_up_s
        self.cost_log.add_decode(sum([r.num_tokens for r in record.rounds]), 1e3 * decode_s)
        if pure:
            self.observe_overhead(len(record.rounds), 1e3 * (record.wall_s - decode_s))

    def run_estimate(self, expected_tokens) -> dict | None:
        """The run's decode steps (their batch sizes, cost_log) as the cost model prices them
        (step_cost_curve, every request drafting k; expected_tokens(k): E[tokens | k] from the
        final estimates): output tokens per second of plain decoding (k = 0) and of the best fixed
        k >= 1, beside the tokens per second the timed decode steps measured; None before any."""
        sizes, log = self.cost_log.batch_sizes, self.cost_log
        if self.step_costs is None or not sizes or log.decode_ms <= 0:
            return None
        tokens, ms = [0.0] * (self.max_k + 1), [0.0] * (self.max_k + 1)
        for batch_size, steps in sizes.items():
            for k, cost in enumerate(self.step_cost_curve(batch_size)):
                tokens[k] += steps * batch_size * expected_tokens(k)
                ms[k] += steps * cost
        rate = [1e3 * t / m for t, m in zip(tokens, ms)]
        best = max(range(1, self.max_k + 1), key=rate.__getitem__) if self.max_k else 0
        return {"plain_tokens_per_s": round(rate[0], 2), "best_fixed_k": best,
                "best_fixed_tokens_per_s": round(rate[best], 2),
                "measured_tokens_per_s": round(1e3 * log.decode_tokens / log.decode_ms, 2)}

    def observe_prefill(self, module_tokens: int, ms: float) -> None:
        """A prefill step's speculator part (its modules over module_tokens prompt tokens x modules,
        then the first drafts) took ms: the median ms per module-token of the last cost_window
        such steps (`prefill_ms`)."""
        if module_tokens > 0:
            self.prefill_module_ms.add(max(0.0, ms) / module_tokens, self.steps)

    def observe_module_rounds(self, record, depth_per_request: bool) -> None:
        """A timed step's (StepRecord) module work outside its draft round: the prefill's
        (`observe_prefill`, with per-request depths only) and the lazy catch-up's (its median ms
        per position x module, `catch_up_ms`)."""
        if record.prefill_module_tokens and depth_per_request:
            self.observe_prefill(record.prefill_module_tokens, 1e3 * record.prefill_draft_s)
        if record.catch_up_module_tokens > 0:
            self.catch_up_module_ms.add(1e3 * record.catch_up_s / record.catch_up_module_tokens, self.steps)
            self._costs_changed()

    def catch_up_ms(self) -> float:
        """Predicted ms of the lazy catch-up per position and module (mtpx/engine/lazy_catch_up.py):
        measured (`observe_module_rounds`), else the module prefill's (the same prefill-like
        round: `prefill_ms`), else 0."""
        for median in (self.catch_up_module_ms, self.prefill_module_ms):
            if median.count:
                return median.value
        return 0.0

    def set_prefill_cost(self, ms_per_module_token: float) -> None:
        """The start-up measurement of a prefill's speculator part, ms per prompt token and module
        (auto_k.costs.calibrate_prefill_cost): the first value of the running median that
        `observe_prefill` feeds, so the first admissions weigh their prefill too. Kept by reset."""
        self._prefill_prior = max(0.0, ms_per_module_token)
        self.prefill_module_ms = self._prefill_median()

    def _prefill_median(self) -> RunningMedian:
        """A fresh running median of the module prefill's ms per token (`observe_prefill`), holding
        `set_prefill_cost`'s value when there is one."""
        median = RunningMedian(self.cost_window)
        if self._prefill_prior is not None:
            median.add(self._prefill_prior, self.steps)
        return median

    def prefill_ms(self, depth: int, prompt_tokens: int) -> float:
        """Predicted ms of a request's draft modules over its prompt at depth (`observe_prefill`,
        from `set_prefill_cost`'s value; 0 before any)."""
        return depth * prompt_tokens * self.prefill_module_ms.value if self.prefill_module_ms.count else 0.0

    def step_cost_curve(self, batch_size: int) -> list[float]:
        """What the decisions compare: cost_curve plus the step's learned overhead at its batch
        bucket (`observe_overhead`; 0 before any step). Shared, as cost_curve's."""
        memo, key = self._memo(), ("step", batch_size)
        if key not in memo:
            extra = self.overhead[b].value if (b := batch_bucket(batch_size)) in self.overhead else 0.0
            memo[key] = [c + extra for c in self.cost_curve(batch_size)]
        return memo[key]

    def draft_cost(self, k: int, batch_size: int, per_module: list[tuple[int, float]] | None = None) -> float:
        """Predicted ms of the draft round of a step whose requests hold depth k (0 for k = 0): k
        times the per-module ms of the measured draft rounds at batch_size's bucket
        (`_draft_per_module`, or `per_module` when the caller has it; between two measured depths
        linear, beyond them the nearest's), so a depth never measured is priced like the measured
        ones (a depth-k round runs k modules); with none measured, the calibration's draft round
        at k (`set_draft_costs`), else its cost above plain decoding's, t(k) - t(0) (all of it, as
        if the verification's wider window were free: at compiled batch 16 on the demo that read
        29 ms for a 4-module round of 5.5, and a k = 0 step below one request held at depth 4
        looked as dear as verifying 4 drafts, so the k in use never fell while it ran)."""
        if k <= 0:
            return 0.0
        per_module = self._draft_per_module(batch_size) if per_module is None else per_module
        if per_module:
            return k * _interpolate(per_module, k, 0.0)
        if self._draft_costs is not None:
            return _in_batch(self._draft_costs, self._draft_batches, k, batch_size)
        return max(0.0, self.calibrated_cost(k, batch_size) - self.calibrated_cost(0, batch_size))

    def _draft_per_module(self, batch_size: int) -> list[tuple[int, float]]:
        """[(depth, ms a module)] of the draft rounds measured at batch_size's bucket with
        min_cost_observations steps (`observe_parts`), by depth."""
        memo, key = self._memo(), ("draft", batch_size)
        if key not in memo:
            bucket, least = batch_bucket(batch_size), max(1, self.min_cost_observations)
            calibrated = self._calibrated(batch_size)
            memo[key] = [(j, self.factor * r.value * calibrated[j] / j)
                         for (part, j, b), r in sorted(self.part_correction.items())
                         if part == "draft" and b == bucket and j >= 1 and r.count >= least]
        return memo[key]

    def held_cost_curve(self, batch_size: int, held: int, curve: list[float] | None = None,
                        held_modules: int | None = None) -> list[float]:
        """step_cost_curve(batch_size) (or `curve`, when the caller has it) for a step whose deepest
        request holds depth `held`: a k from 1 below it still runs the draft round at `held` (the
        modules past k advance), so it costs draft_cost(held) - draft_cost(k) more (never less);
        k = 0 runs no module (lazy catch-up) and costs the catch-up it defers, held_modules
        (the step's requests' depths summed; None: batch_size x held) x `catch_up_ms`."""
        curve = self.step_cost_curve(batch_size) if curve is None else curve
        if held <= 0:
            return curve
        per_module = self._draft_per_module(batch_size)
        top = self.draft_cost(min(held, self.max_k), batch_size, per_module)
        deferred = (batch_size * held if held_modules is None else held_modules) * self.catch_up_ms()
        return [c + deferred if k == 0 else c + max(0.0, top - self.draft_cost(k, batch_size, per_module))
                if k < held else c for k, c in enumerate(curve)]

    def calibrated_cost(self, k: int, batch_size: int) -> float:
        """The start-up calibration's step ms, interpolated in the batch size (module doc)."""
        return self._calibrated(batch_size)[k]

    def _calibrated(self, batch_size: int) -> list[float]:
        """calibrated_cost(k, batch_size) for k = 0 .. max_k (shared, as cost_curve's; kept until
        set_step_costs)."""
        memo = self._calibrated_by_batch
        if batch_size not in memo:
            memo[batch_size] = [_in_batch(self.step_costs, self._batches, k, batch_size)
                                for k in range(self.max_k + 1)]
        return memo[batch_size]

    def observe_step(self, k: int, batch_size: int, step_ms: float, num_tokens: int | None = None,
                     verify_ms: float | None = None, draft_depth: int | None = None,
                     expected_tokens: float = 0.0) -> None:
        """A pure decode step (no prefill) of batch_size requests that each verified k drafts and
        proposed k, taking step_ms and committing num_tokens (None: not logged): log the prediction
        the step's k was chosen with against the measurement (cost_log; call this before `record`
        and `observe` change the estimates), then update the cost corrections (module doc);
        verify_ms (of step_ms): also the two parts' (`observe_parts`). draft_depth: the draft
        modules the round ran (None: k); deeper than k, the modules past k caught up for requests
        held deeper, so the step is not k's cost: only its parts are learned, the draft round's
        at draft_depth (a depth-d catch-up runs d modules, as proposing d drafts does)."""
        if self.step_costs is None or batch_size < 1:
            return
        if num_tokens is not None:
            if (p := self.prediction) is not None and p[:2] == (batch_size, k):
                ms_k, ms_0 = p[2], p[3]         # the costs the step was chosen with
            else:
                curve = self.cost_curve(batch_size)
                ms_k, ms_0 = curve[k], curve[0]
            self.cost_log.add(k, batch_size, expected_tokens, ms_k, ms_0,
                              self.calibrated_cost(0, batch_size), num_tokens, step_ms)
        held = k if draft_depth is None else max(k, min(draft_depth, self.max_k))
        if held == k:
            self._learn_cost(k, batch_size, step_ms / self.calibrated_cost(k, batch_size))
        if verify_ms is not None:
            self.observe_parts(k, held, batch_size, verify_ms, step_ms - verify_ms)

    def observe_parts(self, verified: int, proposed: int, batch_size: int, verify_ms: float,
                      draft_ms: float) -> None:
        """A pure decode step whose batch_size requests each verified `verified` drafts (verify_ms)
        and proposed `proposed` (draft_ms): per batch bucket, the shapes verify_ms / t(verified)
        and draft_ms / t(proposed) over the level (t: the calibration; `_learn_cost`), the median
        of the last cost_window steps. A k's two shapes sum to its own once both have
        min_cost_observations steps (`_known_ratios`): an exploring probe (propose k + 1, then
        verify k + 1 and propose k) measures k + 1 with no steady step at it, among the steps
        that set the level."""
        if self.step_costs is None or batch_size < 1:
            return
        for part, k, ms in (("verify", verified, verify_ms), ("draft", proposed, draft_ms)):
            if 0 <= k <= self.max_k:
                running_median(self.part_correction, (part, k, batch_bucket(batch_size)),
                               max(0.0, ms) / self.calibrated_cost(k, batch_size) / self.factor,
                               self.cost_window, self.steps)
        self._costs_changed()

    def observe_allocation(self, allocation: Allocation, step_ms: float, num_tokens: int) -> None:
        """observe_step for a pure ragged decode step of per-request ks (`allocate`): the
        prediction it was allocated with against step_ms and num_tokens committed; its cost
        corrections are kept under the nearest integer k."""
        B = len(allocation.num_drafts)
        if self.step_costs is None or B < 1:
            return
        x = allocation.mean_drafts
        k = min(self.max_k, round(x))
        curve = self.cost_curve(B)
        self.cost_log.add(k, B, allocation.expected_tokens / B, allocation.predicted_ms, curve[0],
                          self.calibrated_cost(0, B), num_tokens, step_ms)
        lo = min(int(x), self.max_k)
        hi = min(lo + 1, self.max_k)
        low, high = self.calibrated_cost(lo, B), self.calibrated_cost(hi, B)
        calibrated = low + (x - lo) * (high - low)
        self._learn_cost(k, B, step_ms / calibrated)

    def _learn_cost(self, k: int, batch_size: int, ratio: float) -> None:
        """One measured / calibrated ratio at k drafts, as level x shape: k's shape at the batch
        bucket learns ratio / the level while the level's last cost_window steps hold other (k,
        bucket)s' (a switch of the k in use, mixed batch sizes), else keeps its value (a change
        of a k running alone is the level's); the level (`factor`) learns ratio / k's shape.
        Each is the median of its last cost_window values. Load from another process moves every
        k alike for seconds at a time: with one ratio per k, a k last measured in a dear stretch
        stayed dear after it (eager concurrency 1: k = 6 and 8 at 1.55x and 1.18x their
        calibration kept 54 of 128 requests at depth 4; experiments/concurrency/level_and_shape).
        A median polish (Tukey 1977, Exploratory Data Analysis, ch. 11) over time, online."""
        key = (k, batch_bucket(batch_size))
        level, table = self.factor, self.bucket_correction
        running_median(self.correction, k, ratio, self.cost_window, self.steps)     # reported: the raw ratio
        if any(other != key for other in self._level_keys):
            running_median(table, key, ratio / level, self.cost_window, self.steps)
        else:
            running_median(table, key, table[key].value if key in table else 1.0, self.cost_window,
                           self.steps)
        shape = self._known_shape(key)
        self.every_k_correction.add(ratio / (1.0 if shape is None else shape), self.steps)
        self._level_keys.append(key)
        self._costs_changed()

    @property
    def factor(self) -> float:
        """The level: the median of the last cost_window steady steps' measured / calibrated ratios,
        each over its k's shape (`_learn_cost`; 1 before any)."""
        return self.every_k_correction.value if self.every_k_correction.count else 1.0


def _in_batch(costs: dict, batches: list[int], k: int, batch_size: int) -> float:
    """costs[(k, B)] at batch_size: linear between the calibrated batch sizes around it,
    proportional to it beyond the largest, the smallest's below it."""
    if batch_size >= batches[-1]:
        return costs[(k, batches[-1])] * batch_size / batches[-1]
    if batch_size <= batches[0]:
        return costs[(k, batches[0])]
    i = bisect.bisect_right(batches, batch_size)
    b0, b1 = batches[i - 1], batches[i]
    w = (batch_size - b0) / (b1 - b0)
    return (1 - w) * costs[(k, b0)] + w * costs[(k, b1)]
