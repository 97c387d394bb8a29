"""Automatic k (`num_speculative_tokens=auto`): every step, the k in {0 .. max_k} of the highest
predicted goodput at the step's batch size B, and each admitted request's draft depth. Scheduler
side: no torch, no I/O, no measurement (calibration.py measures, store.py keeps the costs).

    goodput(k, B) = B * E[tokens | k] / t_step(k, B),    E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} p_j

p_j: the conditional acceptance of draft position j (acceptance.py: discounted counts from the
prior, engine-wide and per age of the generation); t_step: the calibrated decode-step ms, smoothed
over k, linear in B between calibrated batch sizes, times a correction learned online from pure
decode steps (cost_learning.py), plus the step's learned overhead. The k in use changes by a
hysteresis after `patience` steps in a row; probes and exploring (exploring.py) test the ks the
estimates cannot yet tell apart; a settled decision holds a few steps (settled.py), a step of
plain decoding decides nothing (plain_stretch.py); a request's depth is chosen at admission
(admission.py) and only falls; per-request k (request_k.py): each decode verifies its own k.

The scheduler calls `plan` before a step and `observe` after it (mtpx/core/step_plan.py). Queries
(`decide`, `decide_depth`, ...) change no state; `commit`, `commit_depth` apply a decision.
docs/automatic_k.md gives the rules and derivations, docs/results.md the measurements.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

from mtpx.auto_k.acceptance import AcceptanceEstimates
from mtpx.auto_k.admission import admission_depth
from mtpx.auto_k.choices import DepthChoice, StepChoice
from mtpx.auto_k.config import AutoKConfig
from mtpx.auto_k.cost_curve import smooth_step_costs
from mtpx.auto_k.cost_learning import StepCosts
from mtpx.auto_k.exploring import Exploring
from mtpx.auto_k.plain_stretch import PlainStretch
from mtpx.auto_k.request_k import Allocation, PerRequestK, curve_at
from mtpx.auto_k.settled import SettledDecisions
from mtpx.auto_k.summary import summary
from mtpx.core.step_plan import StepPlan, StepRecord, StepView, num_new_drafts

__all__ = ["AutoKConfig", "AutoDraftLength", "Allocation", "StepChoice", "DepthChoice", "smooth_step_costs"]


class AutoDraftLength:
    """The automatic k (module doc), called by the scheduler through `plan` and `observe`.

    max_k: drafts at most (the speculator's num_speculative_tokens); step_costs: {(k, batch size):
    step ms} for every k in 0..max_k at one or more batch sizes (None: calibrate before the first
    plan; until then every step uses max_k); config: the knobs (AutoKConfig); draft_costs,
    prefill_cost: the calibration's draft rounds and module prefill (`set_draft_costs`,
    `set_prefill_cost`); per_request: each decode of a ragged step verifies its own k (`allocate`).
    Raises ValueError when step_costs lacks a k at one of its batch sizes or for an unknown
    admission_landing.
    """

    def __init__(self, max_k: int, step_costs: dict | None = None, config: AutoKConfig | None = None, *,
                 draft_costs: dict | None = None, prefill_cost: float | None = None,
                 per_request: bool = False):
        config = AutoKConfig() if config is None else config
        if config.admission_landing not in ("batch", "request", "off"):
            raise ValueError(f"admission_landing={config.admission_landing!r}: use batch, request or off")
        self.config, self.max_k = config, max_k
        self.settled = SettledDecisions(config.settled_interval)     # the held decisions (settled.py)
        for f in dataclasses.fields(config):     # the knobs, read by the parts as attributes
            setattr(self, f.name, getattr(config, f.name))
        self.min_verified = config.prior_weight if config.min_verified is None else config.min_verified
        self.costs = StepCosts(max_k, config)     # the step-cost model (cost_learning.py)
        self.exploring = Exploring(max_k, config, self.min_verified, self.costs)   # exploring.py
        self.forced: int | None = None        # every step uses this k (tests drive the policy with it)
        self.forced_depth: int | None = None  # with forced: every request's depth (else forced's)
        self.per_request = per_request   # ragged verification: each request verifies its own k (`allocate`)
        self.per_request_k = PerRequestK(max_k)   # each request's own counts, the allocation (request_k.py)
        self.plain_stretch = PlainStretch()       # a plain step decides nothing (plain_stretch.py)
        self.reset()
        if step_costs is not None:
            self.set_step_costs(step_costs)
        if draft_costs is not None:
            self.costs.set_draft_costs(draft_costs)
        if prefill_cost is not None:
            self.costs.set_prefill_cost(prefill_cost)

    @property
    def step_costs(self) -> dict | None:
        """The calibrated step costs, smoothed (StepCosts; None before calibration)."""
        return self.costs.step_costs

    _steps = property(lambda self: self.costs.steps, lambda self, steps: setattr(self.costs, "steps", steps),
                      doc="Decode steps decided since the reset (the cost model's clock).")

    def set_step_costs(self, step_costs: dict) -> None:
        """The calibration's {(k, batch size): ms} (StepCosts.set_step_costs); decisions start anew."""
        self.costs.set_step_costs(step_costs)
        self.settled.clear()
        self.plain_stretch.clear()

    settled_interval = property(lambda self: self.settled.interval,
                                lambda self, steps: setattr(self.settled, "interval", max(1, steps)),
                                doc="Steps a settled decision holds (settled.py; tests may set it).")

    def reset(self) -> None:
        """Forget the acceptance estimates, the k in use, the histograms and what the running
        engine taught the costs (not the calibrated step costs, nor `set_prefill_cost`'s value)."""
        self.estimates = AcceptanceEstimates(self.max_k, self.prior_acceptance, self.prior_weight, self.decay)
        self.age_mix: list[float] | None = None      # the steps' requests per age bucket, smoothed (`record`)
        self.k = self.max_k
        self.histogram: Counter = Counter()
        self.depth_histogram: Counter = Counter()    # depth -> requests given it
        self.costs.reset()                           # what the engine taught the costs; the step count 0
        self._probes, self._explored = 0, -(10 ** 9)   # probes so far; the step of the last exploring probe
        self.exploring.reset(self.decay)             # nothing spent yet (exploring.py)
        self._switch_streak = self._rising_to = 0    # steps in a row predicting another k in use; a rise's k
        self._lower_streak: dict[int, tuple[int, int]] = {}   # depth -> (last step counted, steps in a row)
        self.per_request_k.reset()
        self._planned: tuple = (False, None)          # the planned step's depth_per_request and allocation
        self.settled.clear()
        self.plain_stretch.clear()

    @property
    def acceptance(self) -> list[float]:
        """The engine-wide p_j, j = 1 .. max_k (acceptance.py; tests may set them)."""
        return self.estimates.pooled

    @acceptance.setter
    def acceptance(self, values: list[float]) -> None:
        self.estimates.set_pooled(values)

    num_observed = property(lambda self: self.estimates.num_observed, doc="Drafts verified per position.")

    def expected_tokens(self, k: int, mix: list[float] | None = None) -> float:
        """E[tokens per request step | k] from the current estimates: engine-wide, or the mean over
        a batch's age buckets (mix: AcceptanceEstimates.mix)."""
        return self.estimates.expected_tokens(k, mix)

    def unlearned(self, k: int, mix: list[float] | None = None) -> bool:
        """Whether draft position k + 1 is unlearned: k < max_k and its discounted verified drafts
        (engine-wide, or in one of mix's age buckets) are fewer than min_verified (by default
        prior_weight: its estimate is mostly the prior)."""
        return self.estimates.unlearned(k, self.min_verified, mix)

    def goodput(self, k: int, batch_size: int) -> float:
        """Predicted tokens per ms (the step's learned overhead included)."""
        return batch_size * self.expected_tokens(k) / self.costs.step_cost_curve(batch_size)[k]

    def _goodputs(self, batch_size: int, top: int, mix: list[float] | None = None, held: int = 0,
                  depths: list[int] | None = None, curve: list[float] | None = None) -> list[float]:
        """goodput(k, batch_size) for k = 0 .. top (one cost curve, the overhead included), the
        tokens of the batch's age mix (None: engine-wide); held: the deepest running request's
        depth, whose draft round a smaller k still pays (`held_cost_curve`); depths: the running
        requests' depths (None: every request drafts k), each drafting min(k, its depth) in a
        step whose cost is k's (a request at depth 0 commits one token in a k = 8 step); curve: the
        costs per k when the caller has them (else held_cost_curve(batch_size, held))."""
        if curve is None:
            curve = self.costs.held_cost_curve(batch_size, held, None, sum(depths or ()) or None)
        tokens = self.estimates.expected_tokens_upto(top, mix)
        if not depths:
            return [batch_size * tokens[k] / curve[k] for k in range(top + 1)]
        count = Counter(depths)
        n = sum(count.values())
        return [batch_size * sum(m * tokens[num_new_drafts(k, d)] for d, m in count.items()) / n / curve[k]
                for k in range(top + 1)]

    def request_acceptance(self, key) -> list[float]:
        """p_j, j = 1 .. max_k, of one request (RequestEstimates.acceptance)."""
        return self.per_request_k.requests.acceptance(key, self.acceptance)

    def ragged_cost(self, mean_drafts: float, batch_size: int, overhead: bool = True) -> float:
        """Predicted ms of a ragged step of batch_size requests verifying mean_drafts drafts each on
        average (it costs its tokens): request_k.curve_at of step_cost_curve (overhead), else of
        cost_curve."""
        curve = self.costs.step_cost_curve(batch_size) if overhead else self.costs.cost_curve(batch_size)
        return curve_at(curve, mean_drafts)

    def allocate(self, requests: list[tuple[object, int]]) -> Allocation:
        """Per-request k of a ragged step (per_request): requests [(key, drafts held)] ->
        Allocation (mtpx/auto_k/request_k.py, `allocate`) over each request's own estimates (with
        `explore`, a draw from their posterior: RequestEstimates.sample) and the ragged step
        cost; every draft held before the costs are known. A query but for the draw."""
        held = [max(0, min(n, self.max_k)) for _, n in requests]
        if self.step_costs is None or self.forced is not None or not requests:
            return Allocation(held, sum(held) / max(1, len(held)), 0.0, 0.0)
        B = len(requests)
        return self.per_request_k.allocate([(key, n) for (key, _), n in zip(requests, held)], self.estimates,
                                           self.prior_acceptance, self.prior_weight,
                                           lambda x, overhead: self.ragged_cost(x, B, overhead))

    def plan(self, view: StepView) -> StepPlan:
        """One step's decisions (the scheduler's one call before the step; module doc): forget the
        requests that left; the per-request allocation of the decodes (per_request); the depth of
        each waiting request in order, each decided as if the ones before were admitted and
        committed only once view.admit admits it (admission stops at the first it cannot); the
        running depths' falls (one vote per depth); then the step's k for the batch that results."""
        if (plain := self.plain_stretch.plan(self, view)) is not None:
            return plain                  # a plain stretch's step decides nothing (plain_stretch.py)
        for key in view.removed:
            self.forget(key)
        allocation, verified, freed = None, None, 0
        if self.per_request and view.decodes:
            allocation = self.allocate(list(view.decodes))
            verified = tuple(allocation.num_drafts)
            freed = sum(held - n for (_, held), n in zip(view.decodes, verified))
        depths, admitted = list(view.running_depths), []
        for c in view.waiting:
            choice, depth = None, c.depth
            if c.first and view.depth_per_request:
                choice = self.decide_depth(view.expected_batch, depths=list(depths),
                                           prompt_tokens=c.prompt_tokens, max_tokens=c.max_tokens)
                depth = choice.depth
            elif c.first:
                depth = self.max_k
            if not view.admit(depth, freed):
                break
            if c.first:
                self.record_depth(depth)
                if choice is not None:
                    self.commit_depth(choice)
            depths.append(depth)
            admitted.append(depth)
        lowered: dict[int, int] = {}
        if view.depth_per_request:
            new: dict[int, int] = {}
            for d in depths:
                if d not in new:                   # one vote per depth and step
                    choice = self.decide_depth(view.expected_batch, d)
                    self.commit_depth(choice)
                    new[d] = choice.depth
            lowered = {d: n for d, n in new.items() if n < d}
            depths = [lowered.get(d, d) for d in depths]
        deepest = max(depths, default=0)
        # a request drafts at most its depth; a smaller k still pays the deepest's round
        if view.depth_per_request:
            step = self.decide(len(depths), deepest, held=deepest, depths=depths)
        else:
            step = self.decide(len(depths), deepest)
        self.commit(step)
        self._planned = (view.depth_per_request, allocation)
        return StepPlan(step.k, tuple(admitted), tuple(lowered.items()), verified, allocation)

    def observe(self, record: StepRecord) -> None:
        """Learn from a finished step (the scheduler's one call after it; module doc): the module
        prefill's cost, the decode step's cost (a per-request allocation's, a steady step's, or
        its two parts'; before `record` and the rounds change the estimates), the step count and
        ages, each request's round, and the step's overhead beyond its forwards."""
        if self.plain_stretch.observe(self, record):       # a plain stretch's step (plain_stretch.py)
            return
        (depth_per_request, allocation), rounds, k, t = self._planned, record.rounds, record.k, record
        if t.timed:      # the module prefill's and the lazy catch-up's cost
            self.costs.observe_module_rounds(t, depth_per_request)
        pure = t.timed and not record.has_prefills
        if rounds and pure and self.forced is None:     # a forced k's steps teach the costs nothing
            self._learn_step(rounds, k, t, depth_per_request, allocation)
        if rounds:
            self.record(k, len(rounds), [r.age for r in rounds])
            for r in rounds:
                if r.num_draft_tokens or self.per_request:    # a round without drafts teaches nothing else
                    self.observe_round(r.num_draft_tokens, r.num_accepted, r.key, r.age)
            if t.timed:           # the run's measured decode; a pure step's overhead
                self.costs.observe_decode(record, pure)

    def _learn_step(self, rounds, k: int, t: StepRecord, depth_per_request: bool, allocation) -> None:
        """A pure timed step's decode cost (`observe`): an allocation's, a steady step's, or its parts'."""
        depths = [r.depth for r in rounds]
        proposes = min(depths) >= k                   # every request proposes k
        verified = {r.verified for r in rounds}
        steady = proposes and verified == {k} and {r.held for r in rounds} == {k}
        committed = sum([r.num_tokens for r in rounds])
        # the modules the draft round ran: requests held deeper than k catch theirs up
        held = max(k, max(depths)) if depth_per_request else k
        if allocation is not None:
            self.costs.observe_allocation(allocation, 1e3 * (t.verify_s + t.draft_s), committed)
        elif steady:
            self.observe_step(k, len(rounds), 1e3 * (t.verify_s + t.draft_s), committed,
                              verify_ms=1e3 * t.verify_s, draft_depth=held)
        elif proposes and len(verified) == 1:
            self.costs.observe_parts(verified.pop(), held, len(rounds), 1e3 * t.verify_s, 1e3 * t.draft_s)

    def observe_step(self, k: int, batch_size: int, step_ms: float, num_tokens: int | None = None,
                     verify_ms: float | None = None, draft_depth: int | None = None) -> None:
        """StepCosts.observe_step with the estimates' E[tokens | k] (before `record`); not while forced."""
        if self.forced is None:
            self.costs.observe_step(k, batch_size, step_ms, num_tokens, verify_ms, draft_depth,
                                    self.expected_tokens(k))

    def forget(self, key) -> None:
        self.per_request_k.requests.forget(key)

    def decide(self, batch_size: int, max_k: int | None = None, ages=None, held: int = 0,
               depths: list[int] | None = None) -> StepChoice:
        """The k for a step of batch_size requests, at most max_k (the deepest running request's
        depth; None: self.max_k), and the k in use, switch streak and probe count it leaves (module
        doc); ages: the running requests' output tokens (None: engine-wide estimates); held: the
        draft modules every step runs whatever its k (multi-module MTP: the deepest running
        depth, whose modules catch up; 0: none), which a smaller k still pays for
        (`held_cost_curve`); depths: the running requests' depths (None: every request drafts
        the step's k), each drafting at most its own (`_goodputs`). A query: `commit` applies it."""
        if self.forced is not None:
            return StepChoice(self.forced)
        top = self.max_k if max_k is None else max(0, min(max_k, self.max_k))
        if self.step_costs is None:
            return StepChoice(top)
        batch_size = max(1, batch_size)
        steps, probes, streak, explored = self._steps + 1, self._probes, self._switch_streak, self._explored
        key = (batch_size, top, held, None if depths is None else tuple(depths), self.k)
        if ages is None and (choice := self.settled.held_step(key, steps, self._probes, self._explored,
                                                               self.probe_interval)) is not None:
            return choice
        mix = self._mix(ages)
        base = self.costs.step_cost_curve(batch_size)
        curve = self.costs.held_cost_curve(batch_size, held, base, None if depths is None else sum(depths))
        g = self._goodputs(batch_size, top, mix, depths=depths, curve=curve)
        best = max(range(top + 1), key=g.__getitem__)
        current = min(self.k, top)     # the k in use, at most the deepest request's depth
        unheld = self._goodputs(batch_size, top, mix, depths=depths, curve=base) if held > current else None
        if best < current and self._falls(g, current, best, mix, unheld) or \
                best > current and self._rises(g, current, best, batch_size, mix, depths, base, held):
            streak += 1
            first_fall = steps == 1 and best < current and batch_size > 1 and not self.patient_start
            if streak >= self.patience or first_fall:
                current, streak = self._landing(g, best, current - 1, mix) if best < current else best, 0
        else:
            streak = 0
        rising_to = best if streak and best > current else 0
        k = current
        target = (self.exploring.target(self.estimates, current, batch_size, top, mix)
                  if steps - explored >= self.patience else None)
        if target is not None:
            k, explored = target, steps           # an exploring probe
        elif self.probe_interval and steps % self.probe_interval == 0:
            probes += 1
            up = probes % 2 == 1
            if up and current < top:
                k = current + 1
            elif not up and current > 0:
                k = current - 1
        probed = k if target is not None else current     # a one-off probe is not exploring's
        spend = curve[probed] - base[current]             # base: the k in use with nothing held deeper
        cost = self.costs.cost_curve(batch_size)
        return StepChoice(k, current, steps, probes, streak, explored, curve[k], max(0.0, spend), rising_to,
                          (batch_size, k, cost[k], cost[0]),
                          self.settled.settles(key, steps, k, current, streak, rising_to, ages))

    def _falls(self, g: list[float], k: int, smaller: int, mix, unheld: list[float] | None = None) -> bool:
        """Whether a fall from k to `smaller` pays (g: `_goodputs`): smaller beats k by more than the
        hysteresis, also with nothing held deeper than k (unheld: `_goodputs` on the unheld curve; a
        k = 0 step defers a held depth's catch-up, a transient, `_rises`), and also with its unlearned
        positions past `smaller` at their upper estimates (a fall the prior alone predicts waits)."""
        margin = 1 + self.hysteresis
        if not g[smaller] > margin * g[k] or unheld is not None and not unheld[smaller] > margin * unheld[k]:
            return False
        tokens = self.estimates.expected_tokens(k, mix, smaller, self.optimism, self.min_verified)
        return g[smaller] > margin * g[k] * tokens / self.estimates.expected_tokens(k, mix)

    def _rises(self, g: list[float], k: int, larger: int, batch_size: int, mix, depths, base: list[float],
               held: int) -> bool:
        """Whether a rise from k to `larger` pays (g: `_goodputs` on the held cost curve): larger
        beats k by more than rise_hysteresis, and also with no request held deeper than k (base:
        the unheld step cost curve; computed only when a deeper depth is held). A held depth's
        catch-up is a transient (explored, or waiting to fall), and a rise it alone pays for would
        admit the next requests at the larger k and keep itself going."""
        margin = 1 + self.rise_hysteresis
        if not g[larger] > margin * g[k]:
            return False
        if held <= k:
            return True
        g0 = self._goodputs(batch_size, larger, mix, depths=depths, curve=base)
        return g0[larger] > margin * g0[k]

    def _landing(self, g: list[float], best: int, top: int, mix) -> int:
        """Where a fall to `best` lands (g: `_goodputs`; unlearned positions past best at their upper
        estimates): the smallest k in best .. top beating best by the hysteresis and within it of
        the highest (the cheaper k wins a tie: eager concurrency 4 chose k = 5 for a 3% lead over
        4, its steps then 3-8% over calibration), else best (always without `optimistic_falls`)."""
        if not self.optimistic_falls or top <= best:
            return best
        upper, margin = self._upper_goodputs(g, best, top, mix), 1 + self.hysteresis
        peak = max(upper[best:top + 1])
        lands = [j for j in range(best, top + 1) if margin * upper[j] >= peak and upper[j] > margin * g[best]]
        return lands[0] if lands else best

    def _upper_goodputs(self, g: list[float], best: int, top: int, mix) -> list[float]:
        """g[j], j = 0 .. top, with the unlearned positions past best at their upper estimates."""
        est = self.estimates
        raised = est.expected_tokens_upto(top, mix, best, self.optimism, self.min_verified)
        return [x * r / t for x, r, t in zip(g, raised, est.expected_tokens_upto(top, mix))]

    def _mix(self, ages) -> list[float] | None:
        """The age mix a decision weighs the estimates by: of `ages` when given, else the decode
        steps' smoothed one (`record`; None before any: engine-wide estimates)."""
        return self.estimates.mix(ages) if ages is not None else self.age_mix

    def choose(self, batch_size: int, max_k: int | None = None, ages=None) -> int:
        return self.decide(batch_size, max_k, ages).k     # the k the next step would propose (a query)

    def commit(self, choice: StepChoice) -> None:
        """Apply a step's decision (from `decide` on the current state): the k in use, the step
        count, the probe count and the switch streak."""
        self.costs.prediction = choice.predicted
        if choice.steps is None:          # forced, or no step costs yet: nothing to advance
            return
        self.settled.commit(choice)
        self.k, self._steps, self._probes = choice.k_in_use, choice.steps, choice.probes
        self._switch_streak, self._explored = choice.switch_streak, choice.explored
        self._rising_to = choice.rising_to
        self.exploring.budget.step(choice.step_ms, choice.explore_ms)

    def decide_depth(self, batch_size: int, current: int | None = None, ages=None,
                     depths: list[int] | None = None, prompt_tokens: int = 0,
                     max_tokens: int | None = None) -> DepthChoice:
        """The depth of a request admitted when batch_size requests run or wait (current None:
        `admission_depth`; max_k before the costs are known), or of a running request at depth
        `current`, which only falls: to the best k below it when
        that beats it by more than the hysteresis (its unlearned positions at their upper estimates
        too: `_falls`), and to the k in use when that is smaller, in
        `patience` decode steps in a row, else current; the vote this step casts for it is in the
        result (`commit_depth` counts it); ages: the running requests' output tokens (`decide`);
        depths, prompt_tokens, max_tokens: an admission's (`admission_depth`). A query."""
        top = self.max_k if current is None else current
        if self.forced is not None:
            forced = self.forced if self.forced_depth is None else self.forced_depth
            return DepthChoice(min(forced, top), current)
        if self.step_costs is None:
            return DepthChoice(top, current)
        batch_size, mix = max(1, batch_size), self._mix(ages)
        if current is None:
            return admission_depth(self, batch_size, mix, depths, prompt_tokens, max_tokens)
        if current == 0:                   # nothing to fall to
            return DepthChoice(0, 0, (self._steps, 0))
        key = (batch_size, current, self.k, self._rising_to)
        if ages is None and (choice := self.settled.held_depth(current, key, self._steps)) is not None:
            return choice
        g = self._goodputs(batch_size, top, mix)
        best = max(range(top + 1), key=g.__getitem__)
        # a running request's depth falls after `patience` steps in a row predict it (counted once
        # per step for every request at this depth): to a smaller k that pays by the hysteresis,
        # and at most to the k in use (its modules beyond it only catch up), but not below
        # the depth explored beyond the k in use (an exploring probe verifies it)
        fall = best < current and self._falls(g, current, best, mix)
        want = min(self._landing(g, best, current - 1, mix) if fall else current,
                   max(self.k, self._rising_to))
        target = (self.exploring.target(self.estimates, self.k, batch_size, self.max_k, mix) if want < current
                  else None)
        if target is not None:
            want = max(want, min(current, target))
        last, streak = self._lower_streak.get(current, (-1, 0))
        if want >= current:
            settled = (key, self._steps) if ages is None and self.settled.interval > 1 else None
            return DepthChoice(current, current, (self._steps, 0), settled=settled)
        if last != self._steps:
            streak += 1
            return DepthChoice(want if streak >= self.patience else current, current, (self._steps, streak))
        return DepthChoice(want if streak >= self.patience else current, current)

    def depth(self, *args, **kwargs) -> int:
        return self.decide_depth(*args, **kwargs).depth      # no state changes

    def commit_depth(self, choice: DepthChoice) -> None:
        """Count a running depth's vote of this step, or an admitted request's exploring spend
        (from `decide_depth` on the current state)."""
        if choice.streak is not None:
            self._lower_streak[choice.current] = choice.streak
        if choice.current is not None:
            self.settled.commit_depth(choice)
        if choice.explore_ms:           # an explored admission's prefill (`admission_depth`)
            self.exploring.budget.admission(choice.step_ms, choice.explore_ms)

    def record_depth(self, depth: int) -> None:
        """A request was admitted with this depth: count it."""
        self.depth_histogram[depth] += 1

    def summary(self) -> dict:
        """metrics.json's auto_k (summary.py)."""
        return summary(self)

    def reset_histograms(self) -> None:
        """Forget the histograms and predicted-vs-measured log (a measured pass starts)."""
        self.histogram.clear()
        self.depth_histogram.clear()
        self.per_request_k.verified_histogram.clear()
        self.costs.cost_log.clear()

    def observe_round(self, num_draft_tokens: int, num_accepted: int, key=None,
                      age: int | None = None) -> None:
        """One request's round: drafts 1 .. min(num_accepted + 1, num_draft_tokens) verified given
        every earlier one accepted, the first num_accepted accepted. key: the request's (its own
        counts), None: engine-wide only; age: its output tokens before it (acceptance.py)."""
        n = min(num_accepted + 1, num_draft_tokens)
        if key is not None and self.per_request:
            self.per_request_k.observe(key, num_draft_tokens, n, num_accepted)
        self.estimates.observe(n, num_accepted, age)

    def record(self, k: int, batch_size: int | None = None, ages=None) -> None:
        """A decode step of batch_size requests (None: not counted per bucket) chose k (before its
        rounds are observed): count it, discount the acceptance counts (module doc); ages: its
        requests' output tokens, whose shares per age bucket enter `age_mix`, an EMA of weight
        1 - decay from equal shares (steady over the waves of young requests admitted together,
        so that a depth, which never rises again, is not lowered for their first rounds)."""
        self.histogram[k] += 1
        if batch_size:
            self.costs.cost_log.count_decode_step(batch_size)
        self.estimates.decay()
        mix = self.estimates.mix(ages)
        if mix is not None:         # from every age alike: a first wave of young requests is a transient
            old, f, total = self.age_mix or [1 / len(mix)] * len(mix), self.decay, sum(mix)
            self.age_mix = [f * a + (1 - f) * n / total for a, n in zip(old, mix)]
