"""The depth policy: how many drafts each engine step proposes, a fixed num_speculative_tokens
or `num_speculative_tokens=auto`: the scheduler side's draft-length policy (no torch). No I/O and
no measurement (mtpx/engine/auto_k/costs.py measures the step costs, smooth_step_costs below fits
them, mtpx/engine/auto_k/store.py keeps them between runs; mtpx/core/cost_learning.py and
mtpx/core/exploring.py hold the step-cost and exploring halves of AutoDraftLength). Queries (`decide`, `choose`,
`decide_depth`, `depth`, `goodput`, ...) never change state; `commit` and `commit_depth` apply a
decision, and `record`, `observe`, `observe_step` learn from a step (the scheduler calls them once per step).

Auto (`AutoDraftLength`) picks, every step, the k in {0 .. max_k} with the highest predicted
goodput at the step's batch size B:

    goodput(k, B) = B * E[tokens | k] / t_step(k, B),    E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} p_j

where p_j is the conditional acceptance of draft position j (accepted, given every earlier draft
of the round was accepted: the expected accepted count of a round is the sum of its survival
probabilities, Leviathan et al. 2023, eq. 1, here without their i.i.d. assumption), estimated
online from discounted counts, engine-wide and per age of the generation, and E[tokens | k] is
the mean over the age buckets of the decode steps' requests, smoothed over steps (`age_mix`,
mtpx/core/acceptance.py); t_step(k, B) is the engine's own measured
decode-step cost (auto_k.costs.calibrate_step_costs at start-up, or a saved file: auto_k.store),
smoothed over k (cost_curve.smooth_step_costs: a running median over k >= 1, then
non-decreasing, so calibration noise cannot make a larger k look cheaper), linear in B between
calibrated batch sizes and proportional to B beyond the largest, times a correction learned
online from the engine's pure decode steps (no prefill): a level times a shape per (k, batch
bucket) (`_learn_cost`; each the median of its last `cost_window` steps: dear steps come in
streaks; a shape fading toward 1 by `cost_decay` per step since last measured), used once a k has
`min_cost_observations` steps in B's bucket, either steady ones (`observe_step`: every request
verifying and proposing the step's k, none held deeper) or as many verifying k and as many proposing k, whose
verify and draft parts add up (`observe_parts`) (ks between two such ks interpolate, ks beyond them take the nearest one's); with
none, the level alone; then non-decreasing in k again, so a k measured cheaper can
win but never look cheaper than a smaller k. Every observed step also records its prediction
against its measurement per batch bucket (cost_model_log.CostModelLog, metrics.json's
auto_k.cost_model). docs/automatic_k.md has the measurements behind these rules.

- The estimates start at the prior p_0 = 0.7 with w = 8 pseudo-drafts, and a position no step
  verifies drifts back to it as its counts decay. Every `probe_interval` steps one step proposes
  one draft more than the k in use, the next probe one fewer. Why: docs/automatic_k.md.
- Exploring (`explore_depth`): while a position in k + 1 .. k' (k in use) is unlearned (fewer
  than `min_verified` discounted verified drafts in an age bucket holding 5% of the steps'
  requests) and k' would beat k by more than the hysteresis with the unlearned positions at their
  upper estimates (`optimism` standard deviations: acceptance.py), or k + 1's step cost at the batch size is the calibration's alone
  (`cost_unlearned`) and could pay at `cost_share` of its predicted cost over k's, requests are
  admitted at depth k' (the smallest such; k + 1 for a cost), running ones do not fall below it (nor
  fall at all when shallower: a depth never rises again), and every `patience` steps a step
  proposes k' drafts, so a prior that says k = 0, or a calibration that misjudges k + 1, is
  tested, and a k = 1 that never pays does not block k = 4. Exploring pauses while it has spent
  `explore_budget` of the steps' predicted cost (`explore_spent`: its probes, and the catch-up
  of the requests it holds deeper than the k in use, which every step pays): a position whose
  discounted count its probes alone can never raise to min_verified would otherwise be
  explored for ever. The k in use falls only where the smaller k beats it with its unlearned
  positions at their upper estimates too (a fall the prior
  alone predicts waits for the drafts that test it), and it lands on the k between of the highest
  goodput with those positions at their upper estimates where that beats the smaller k by the
  hysteresis (`_landing`; so do a running depth's fall and an admission below the k in use, the
  admission with its own prefill weighed, or on the batch's goodputs: `admission_landing`): a k
  in between that could pay is tested by the whole batch, not only by exploring's probes. In a
  batch, an admission landing on upper estimates that lead the best k by at most
  `free_landing_lead` is exploring's: it waits for the budget and spends its extra prefill from it
  (a first wave at k = 4 on a 4-7% lead cost compiled concurrency 16's first chunk 8-16%).
- Hysteresis: the k in use falls when a smaller k's predicted goodput beats it by more than
  `hysteresis` (a fraction), rises when a larger one's does by `rise_hysteresis` (less: the steps
  after a rise verify its drafts, a fall stops testing them), each after `patience` decode steps
  in a row (but the first step after a reset falls at once in a batch: max_k, where the k in use
  starts, is no decision; `patient_start` waits); a running depth falls under the same two conditions.
- A step with k = 0 still advances every draft module of a request's depth over the accepted
  tokens (the speculators' catch-up), so the module KV is exact when drafting resumes: choosing
  the step's k, a k below the deepest running depth pays that depth's draft round
  (`held_cost_curve`: the draft rounds measured online, else the calibration's: `set_draft_costs`),
  but a rise of the k in use must pay with nothing held too (`_rises`).
- Depth: each request keeps at most `depth(B)` draft modules exact, chosen at its first
  admission (B: the requests running and waiting, at most max_num_seqs): the k of highest
  predicted goodput at that batch size, by the falls' or rises' margin over the k in use (above it,
  only where the running requests' steps would follow or the evidence says so:
  `_admission_rises`), each k's ms per token plus the request's module prefill at that depth
  spread over its max_tokens (`prefill_ms`, measured at start-up and by every prefill;
  `_with_prefill`); an explored admission (exploring, above) pays the same prefill, spent from
  the budget when it is admitted (mtpx/core/admission.py). A step's k
  is at most the largest running depth and each request drafts min(k, its depth); modules
  beyond a request's depth never run for it. A running depth may fall, never rise (a module
  that skipped positions would have to re-prefill them all): to a k that pays by the hysteresis,
  and to the k in use when that is below it (its modules beyond the k only catch up; not while
  the k in use rises toward it), each after `patience` decode steps in a row. Single-module: max_k.
- Settled (`settled_interval`, mtpx/core/settled.py): a full decision that keeps the k in use
  with no switch streak, rise or probe holds for the next settled_interval - 1 steps of the same
  batch size, depths and k in use, a probe's step excepted, and so does a running depth's vote to
  stay: a change is seen at most settled_interval - 1 steps late.
- Per request (`per_request`: EngineConfig.per_request_k on eager ragged steps): a step costs its
  tokens, so of the drafts the step before proposed each request verifies those `allocate`
  gives it from its own estimates (mtpx/core/request_k.py). Every decision adds the overhead a
  decode step pays beyond its forwards, learned from the running engine (`observe_overhead`).
"""
from __future__ import annotations

from collections import Counter, deque

from mtpx.core.acceptance import AcceptanceEstimates
from mtpx.core.admission import Admission
from mtpx.core.cost_curve import RunningMedian, StepMemo, smooth_step_costs
from mtpx.core.cost_learning import StepCostLearning
from mtpx.core.auto_summary import AutoSummary
from mtpx.core.cost_model_log import CostModelLog
from mtpx.core.exploring import Exploring
from mtpx.core.fixed_draft_length import DepthChoice, FixedDraftLength, StepChoice
from mtpx.core.request_k import Allocation, RequestEstimates, allocate, curve_at, draw_engine_wide
from mtpx.core.settled import SettledDecisions

__all__ = ["FixedDraftLength", "AutoDraftLength", "Allocation", "StepChoice", "DepthChoice", "smooth_step_costs"]


class AutoDraftLength(StepCostLearning, Exploring, Admission, SettledDecisions, AutoSummary):
    """The automatic k (module doc).

    max_k: drafts at most (the speculator's num_speculative_tokens); step_costs: {(k, batch size):
    step ms} for every k in 0..max_k at one or more batch sizes (None: calibrate before the first
    choose; until then every step uses max_k); decay: per-step discount of the acceptance counts;
    prior_weight: pseudo-drafts of acceptance prior_acceptance in each estimate; cost_window: the
    measured steps whose median is a cost correction; cost_decay: per step since a k's cost was
    last measured, its correction fades toward the one of the steps in use; hysteresis: relative
    goodput margin for k to fall; rise_hysteresis: for k to rise (module doc);
    probe_interval: steps between probes (0: none); patience: consecutive steps that must predict
    a change of the k in use, or a running depth's fall, before it happens;
    min_cost_observations: measured steps of a (k, batch bucket) before its own cost correction
    applies; min_verified: discounted verified drafts below which a position is unlearned and
    explored (None: prior_weight; 0: never); explore_costs: explore a neighbour k whose cost
    is unmeasured at the batch size (`cost_unlearned`) where it could pay at cost_share of its
    predicted extra cost; optimism: standard deviations above an estimate at which exploring
    values an unlearned position; explore_budget: the share of the predicted step time (discounted
    by decay) that exploring may spend before it pauses (1: no limit); optimistic_falls: a fall lands
    where the upper estimates pay most (`_landing`), else on the best k (module doc);
    admission_landing: where an admission below the k in use lands (Admission._admission_landing:
    batch, request or off); settled_interval: steps a settled decision holds (module doc; 1: none).
    Raises ValueError when step_costs lacks a k at one of its batch sizes.
    """

    auto = True

    def __init__(self, max_k: int, step_costs: dict | None = None, decay: float = 0.99,
                 prior_weight: float = 8.0, hysteresis: float = 0.05, rise_hysteresis: float = 0.02,
                 probe_interval: int = 32,
                 cost_window: int = 15, cost_decay: float = 0.999, prior_acceptance: float = 0.7, patience: int = 8,
                 min_cost_observations: int = 8, min_verified: float | None = None,
                 explore_costs: bool = True, optimism: float = 1.0, cost_share: float = 0.8,
                 explore_budget: float = 0.001, optimistic_falls: bool = True, admission_landing: str = "request",
                 patient_start: bool = False, free_landing_lead: float = 0.1, settled_interval: int = 4):
        self.max_k, self.hysteresis, self.probe_interval = max_k, hysteresis, probe_interval
        self.rise_hysteresis = rise_hysteresis
        self.patience, self.min_cost_observations = patience, min_cost_observations
        self.min_verified = prior_weight if min_verified is None else min_verified
        self.explore_costs, self.optimism, self.cost_share = explore_costs, optimism, cost_share
        self.explore_budget, self.optimistic_falls = explore_budget, optimistic_falls
        if admission_landing not in ("batch", "request", "off"):
            raise ValueError(f"admission_landing={admission_landing!r}: use batch, request or off")
        self.admission_landing = admission_landing
        self.patient_start, self.free_landing_lead = patient_start, free_landing_lead
        self.settled_interval = max(1, settled_interval)
        self.decay, self.prior_weight, self.cost_window, self.cost_decay = decay, prior_weight, cost_window, cost_decay
        self.prior_acceptance = prior_acceptance
        self.step_costs = None
        self._draft_costs: dict | None = None      # `set_draft_costs`
        self._draft_batches: list[int] = []
        self._prefill_prior: float | None = None   # `set_prefill_cost`
        self.forced: int | None = None        # every step uses this k (tests drive the policy with it)
        self.forced_depth: int | None = None  # with forced: every request's depth (else forced's)
        self.per_request = False   # ragged verification: each request verifies its own k (`allocate`)
        self.explore = True        # allocate from a draw of each request's acceptance (Thompson sampling)
        self.reset()
        if step_costs is not None:
            self.set_step_costs(step_costs)

    def reset(self) -> None:
        """Forget the acceptance estimates, the k in use, the histograms and what the running
        engine taught the costs (not the calibrated step costs, nor `set_prefill_cost`'s value)."""
        self.estimates = AcceptanceEstimates(self.max_k, self.prior_acceptance, self.prior_weight, self.decay)
        self.age_mix: list[float] | None = None      # the decode steps' requests per age bucket, smoothed (`record`)
        self.k = self.max_k
        self.histogram: Counter = Counter()
        self.depth_histogram: Counter = Counter()    # depth -> requests given it
        # the cost corrections, each a RunningMedian of the last cost_window steps' values
        self.correction: dict[int, RunningMedian] = {}    # k -> measured / calibrated step cost (reported)
        self.every_k_correction = RunningMedian(self.cost_window)   # the level over every k (`factor`)
        self._level_keys: deque = deque(maxlen=max(1, self.cost_window))   # its steps' (k, bucket)s
        self.bucket_correction: dict[tuple[int, int], RunningMedian] = {}      # (k, bucket) -> ratio
        self.part_correction: dict[tuple[str, int, int], RunningMedian] = {}   # (part, k, bucket) -> ratio
        self.overhead: dict[int, RunningMedian] = {}  # batch bucket -> ms a step costs beyond its forwards
        self.cost_log = CostModelLog()               # predicted vs measured, per batch bucket
        self._cost_memo = StepMemo()                 # this step's cost curves (StepCostLearning._memo)
        self._steps = self._probes = 0
        self.prefill_module_ms = self._prefill_median()   # a prefill's draft modules: ms per token x module
        self._explored = -(10 ** 9)                  # the step of the last exploring probe
        self._explore_ms = 0.0                       # discounted predicted ms exploring spent (`explore_spent`)
        self._step_ms: float | None = None           # discounted predicted ms of every step (None: no step yet)
        self._switch_streak = self._rising_to = 0    # steps in a row predicting another k in use; the larger one
        self._lower_streak: dict[int, tuple[int, int]] = {}   # depth -> (last step counted, steps in a row)
        self.requests = RequestEstimates(self.max_k)  # each running request's own counts (per_request)
        self.verified_histogram: Counter = Counter()  # drafts verified per request and step (per_request)
        self._prediction: tuple | None = None        # the committed step's StepChoice.predicted (observe_step)
        self._unsettle()

    @property
    def acceptance(self) -> list[float]:
        """The engine-wide p_j, j = 1 .. max_k (acceptance.py; tests may set them)."""
        return self.estimates.pooled

    @acceptance.setter
    def acceptance(self, values: list[float]) -> None:
        self.estimates.set_pooled(values)

    @property
    def num_observed(self) -> list[int]:
        return self.estimates.num_observed

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
        return batch_size * self.expected_tokens(k) / self.step_cost_curve(batch_size)[k]

    def _goodputs(self, batch_size: int, top: int, mix: list[float] | None = None, held: int = 0,
                  depths: list[int] | None = None, curve: list[float] | None = None) -> list[float]:
        """goodput(k, batch_size) for k = 0 .. top (one cost curve, the overhead included), the
        tokens of the batch's age mix (None: engine-wide); held: the deepest running request's
        depth, whose draft round a smaller k still pays (`held_cost_curve`); depths: the running
        requests' depths (None: every request drafts k), each drafting min(k, its depth) in a
        step whose cost is k's (a request at depth 0 commits one token in a k = 8 step); curve: the
        costs per k when the caller has them (else held_cost_curve(batch_size, held))."""
        curve = self.held_cost_curve(batch_size, held) if curve is None else curve
        tokens = self.estimates.expected_tokens_upto(top, mix)
        if not depths:
            return [batch_size * tokens[k] / curve[k] for k in range(top + 1)]
        count = Counter(depths)
        n = sum(count.values())
        return [batch_size * sum(m * tokens[min(k, d)] for d, m in count.items()) / n / curve[k]
                for k in range(top + 1)]

    def request_acceptance(self, key) -> list[float]:
        """p_j, j = 1 .. max_k, of one request (RequestEstimates.acceptance)."""
        return self.requests.acceptance(key, self.acceptance)

    def ragged_cost(self, mean_drafts: float, batch_size: int, overhead: bool = True) -> float:
        """Predicted ms of a ragged step of batch_size requests verifying mean_drafts drafts each on
        average (it costs its tokens): request_k.curve_at of step_cost_curve (overhead), else of
        cost_curve."""
        return curve_at(self.step_cost_curve(batch_size) if overhead else self.cost_curve(batch_size), mean_drafts)

    def allocate(self, requests: list[tuple[object, int]]) -> Allocation:
        """Per-request k of a ragged step (per_request): requests [(key, drafts held)] ->
        Allocation (mtpx/core/request_k.py, `allocate`) over each request's own estimates (with
        `explore`, a draw from their posterior: RequestEstimates.sample) and the ragged step
        cost; every draft held before the costs are known. A query but for the draw."""
        held = [max(0, min(n, self.max_k)) for _, n in requests]
        if self.step_costs is None or self.forced is not None or not requests:
            return Allocation(held, sum(held) / max(1, len(held)), 0.0, 0.0)
        B = len(requests)
        if self.explore:                 # Thompson: the engine-wide p_j drawn, then each request's
            q = self._draw()
            ps = [self.requests.sample(key, q) for key, _ in requests]
        else:
            ps = [self.request_acceptance(key) for key, _ in requests]
        alloc = allocate(held, ps, lambda x: self.ragged_cost(x, B))
        return Allocation(alloc.num_drafts, alloc.mean_drafts, alloc.expected_tokens,
                          self.ragged_cost(alloc.mean_drafts, B, overhead=False))

    def _draw(self) -> list[float]:
        """The engine-wide p_j drawn from their posterior (request_k.draw_engine_wide)."""
        return draw_engine_wide(self.estimates.accepted, self.estimates.verified, self.prior_acceptance, self.prior_weight,
                                self.requests.rng)

    def forget(self, key) -> None:
        self.requests.forget(key)

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
        if ages is None and (choice := self._held_step(key, steps)) is not None:
            return choice
        mix = self._mix(ages)
        base = self.step_cost_curve(batch_size)
        curve = self.held_cost_curve(batch_size, held, base)
        g = self._goodputs(batch_size, top, mix, depths=depths, curve=curve)
        best = max(range(top + 1), key=g.__getitem__)
        current = min(self.k, top)     # the k in use, at most the deepest request's depth
        if best < current and self._falls(g, current, best, mix) or \
                best > current and self._rises(g, current, best, batch_size, mix, depths, base, held):
            streak += 1
            if streak >= self.patience or steps == 1 and best < current and batch_size > 1 and not self.patient_start:
                current, streak = self._landing(g, best, current - 1, mix) if best < current else best, 0
        else:
            streak = 0
        rising_to = best if streak and best > current else 0
        k = current
        target = self._explore_target(current, batch_size, top, mix) if steps - explored >= self.patience else None
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
        cost = self.cost_curve(batch_size)
        return StepChoice(k, current, steps, probes, streak, explored, curve[k], max(0.0, spend), rising_to,
                          (batch_size, k, cost[k], cost[0]), self._settles(key, steps, k, current, streak, rising_to, ages))

    def _falls(self, g: list[float], k: int, smaller: int, mix) -> bool:
        """Whether a fall from k to `smaller` pays (g: `_goodputs`): smaller beats k by more than the
        hysteresis, and also beats k with its unlearned positions past `smaller` at their upper
        estimates (a fall the prior alone predicts waits for the drafts that test it; computed only
        when the first holds)."""
        margin = 1 + self.hysteresis
        if not g[smaller] > margin * g[k]:
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
        """Where a fall to `best` lands (g: `_goodputs`): the k in best .. top of the highest goodput
        with the unlearned positions past best at their upper estimates (the smallest on a tie)
        where that beats best by more than the hysteresis, else best (always without
        `optimistic_falls`), so a k between that could still pay is tested by the whole batch
        before the k falls past it, and one that could only tie it is not."""
        if not self.optimistic_falls or top <= best:
            return best
        upper = self._upper_goodputs(g, best, top, mix)
        land = max(range(best, top + 1), key=upper.__getitem__)
        return land if upper[land] > (1 + self.hysteresis) * g[best] else best

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
        """decide(batch_size, max_k, ages).k: the k the next step would propose (no state changes)."""
        return self.decide(batch_size, max_k, ages).k

    def commit(self, choice: StepChoice) -> None:
        """Apply a step's decision (from `decide` on the current state): the k in use, the step
        count, the probe count and the switch streak."""
        self._prediction = choice.predicted
        if choice.steps is None:          # forced, or no step costs yet: nothing to advance
            return
        self._settled = choice if choice.settled is not None else None
        self.k, self._steps, self._probes = choice.k_in_use, choice.steps, choice.probes
        self._switch_streak, self._explored, self._rising_to = choice.switch_streak, choice.explored, choice.rising_to
        self._explore_ms = self.decay * self._explore_ms + choice.explore_ms
        self._open_budget_window(choice.step_ms)
        self._step_ms = self.decay * self._step_ms + choice.step_ms

    def _open_budget_window(self, step_ms: float) -> None:
        """Before the first step or explored admission: the steps' discounted sum starts as a full
        window, 1 / (1 - decay) steps of step_ms (`explore_spent`)."""
        if self._step_ms is None:
            self._step_ms = step_ms / (1 - self.decay) if self.decay < 1 else 0.0

    def decide_depth(self, batch_size: int, current: int | None = None, ages=None,
                     depths: list[int] | None = None, prompt_tokens: int = 0,
                     max_tokens: int | None = None) -> DepthChoice:
        """The depth of a request admitted when batch_size requests run or wait (current None:
        `_admission`; max_k before the costs are known), or of a running request at depth
        `current`, which only falls: to the best k below it when
        that beats it by more than the hysteresis (its unlearned positions at their upper estimates
        too: `_falls`), and to the k in use when that is smaller, in
        `patience` decode steps in a row, else current; the vote this step casts for it is in the
        result (`commit_depth` counts it); ages: the running requests' output tokens (`decide`);
        depths, prompt_tokens, max_tokens: an admission's (`_admission`). A query."""
        top = self.max_k if current is None else current
        if self.forced is not None:
            return DepthChoice(min(self.forced if self.forced_depth is None else self.forced_depth, top), current)
        if self.step_costs is None:
            return DepthChoice(top, current)
        batch_size, mix = max(1, batch_size), self._mix(ages)
        if current is None:
            return self._admission(batch_size, mix, depths, prompt_tokens, max_tokens)
        if current == 0:                   # nothing to fall to
            return DepthChoice(0, 0, (self._steps, 0))
        key = (batch_size, current, self.k, self._rising_to)
        if ages is None and (choice := self._held_depth(current, key)) is not None:
            return choice
        g = self._goodputs(batch_size, top, mix)
        best = max(range(top + 1), key=g.__getitem__)
        # a running request's depth falls after `patience` steps in a row predict it (counted once
        # per step for every request at this depth): to a smaller k that pays by the hysteresis,
        # and at most to the k in use (its modules beyond it only catch up), but not below
        # the depth explored beyond the k in use (an exploring probe verifies it)
        fall = best < current and self._falls(g, current, best, mix)
        want = min(self._landing(g, best, current - 1, mix) if fall else current, max(self.k, self._rising_to))
        if want < current and (target := self._explore_target(self.k, batch_size, self.max_k, mix)) is not None:
            want = max(want, min(current, target))
        last, streak = self._lower_streak.get(current, (-1, 0))
        if want >= current:
            settled = (key, self._steps) if ages is None and self.settled_interval > 1 else None
            return DepthChoice(current, current, (self._steps, 0), settled=settled)
        if last != self._steps:
            streak += 1
            return DepthChoice(want if streak >= self.patience else current, current, (self._steps, streak))
        return DepthChoice(want if streak >= self.patience else current, current)

    def depth(self, *args, **kwargs) -> int:
        """decide_depth(*args, **kwargs).depth (no state changes)."""
        return self.decide_depth(*args, **kwargs).depth

    def commit_depth(self, choice: DepthChoice) -> None:
        """Count a running depth's vote of this step, or an admitted request's exploring spend
        (from `decide_depth` on the current state)."""
        if choice.streak is not None:
            self._lower_streak[choice.current] = choice.streak
        if choice.current is not None:
            if choice.settled is not None:
                self._settled_depths[choice.current] = choice.settled
            else:
                self._settled_depths.pop(choice.current, None)
        if choice.explore_ms:           # an explored admission's prefill (`_admission`)
            self._open_budget_window(choice.step_ms)
            self._explore_ms += choice.explore_ms

    def record_depth(self, depth: int) -> None:
        """A request was admitted with this depth: count it."""
        self.depth_histogram[depth] += 1

    def reset_histograms(self) -> None:
        """Forget the histograms and predicted-vs-measured log (a measured pass starts)."""
        self.histogram.clear()
        self.depth_histogram.clear()
        self.verified_histogram.clear()
        self.cost_log.clear()

    def observe(self, num_draft_tokens: int, num_accepted: int, key=None, age: int | None = None) -> None:
        """One request's round: drafts 1 .. min(num_accepted + 1, num_draft_tokens) were verified
        given every earlier one was accepted; the first num_accepted were accepted. key: the
        request's (its own counts, request_acceptance), None: engine-wide only; age: its output
        tokens before the round (its age bucket: acceptance.py; None: engine-wide only)."""
        n = min(num_accepted + 1, num_draft_tokens)
        if key is not None and self.per_request:
            self.verified_histogram[num_draft_tokens] += 1
            self.requests.observe(key, n, num_accepted)
        self.estimates.observe(n, num_accepted, age)

    def record(self, k: int, batch_size: int | None = None, ages=None) -> None:
        """A decode step of batch_size requests (None: not counted per bucket) chose k (called
        before its rounds are observed): count it, discount the acceptance counts (an estimate no
        round updates drifts back to the prior: module doc); ages: its requests' output tokens,
        whose shares per age bucket enter `age_mix`, an EMA of weight 1 - decay from equal shares
        (the decisions' mix: steady over the waves of young requests admitted together, the first
        included, so that a depth, which never rises again, is not lowered for their first rounds)."""
        self.histogram[k] += 1
        if batch_size:
            self.cost_log.count_decode_step(batch_size)
        self.estimates.decay()
        mix = self.estimates.mix(ages)
        if mix is not None:         # from every age alike: a first wave of young requests is a transient
            old, f, total = self.age_mix or [1 / len(mix)] * len(mix), self.decay, sum(mix)
            self.age_mix = [f * a + (1 - f) * n / total for a, n in zip(old, mix)]
