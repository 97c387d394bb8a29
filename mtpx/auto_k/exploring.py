"""Exploring, the half of automatic k that tests what the estimates cannot yet tell (scheduler
side, no torch): an unlearned draft position that could pay at its upper estimate, or a
neighbour k whose step cost is only calibrated, within a budget of the steps' predicted cost. An object
AutoDraftLength holds (`Exploring`, with its `ExploreBudget`); mtpx/auto_k/policy.py's module doc
gives the rules."""
from __future__ import annotations

from mtpx.auto_k.cost_learning import with_prefill

__all__ = ["Exploring", "ExploreBudget"]


class ExploreBudget:
    """What exploring spent of the decode steps' predicted cost, both discounted by decay per
    step: an exploring probe's cost over the k in use's, a step's cost over what it would cost
    with no request held deeper than the k in use, and an explored admission's extra prefill.
    The steps' sum starts as a full discount window, 1 / (1 - decay) steps, of the first step's
    cost, so the first probes are measured against a window and not against themselves."""

    def __init__(self, decay: float):
        self.decay = decay
        self.explore_ms = 0.0                 # discounted predicted ms exploring spent
        self.step_ms: float | None = None     # discounted predicted ms of every step (None: no step yet)

    def __eq__(self, other) -> bool:      # a policy's state compares by value (copies in tests)
        return isinstance(other, ExploreBudget) and vars(self) == vars(other)

    def spent(self) -> float:
        """The share spent (0 before any step)."""
        return self.explore_ms / self.step_ms if self.step_ms else 0.0

    def _open(self, step_ms: float) -> None:
        if self.step_ms is None:
            self.step_ms = step_ms / (1 - self.decay) if self.decay < 1 else 0.0

    def step(self, step_ms: float, explore_ms: float) -> None:
        """A committed step of predicted step_ms, explore_ms of it exploring's."""
        self.explore_ms = self.decay * self.explore_ms + explore_ms
        self._open(step_ms)
        self.step_ms = self.decay * self.step_ms + step_ms

    def admission(self, step_ms: float, explore_ms: float) -> None:
        """An explored admission's prefill, explore_ms, at a step of predicted step_ms (the window
        before any step)."""
        self._open(step_ms)
        self.explore_ms += explore_ms


class Exploring:
    """An object AutoDraftLength holds (`exploring`; module doc): which depth beyond the k in use is
    explored, and whether a k + 1 whose cost is only calibrated could pay, within `budget`. max_k;
    config: AutoKConfig (hysteresis, optimism, cost_share, explore_budget, explore_costs);
    min_verified: the policy's (discounted verified drafts below which a position is unlearned);
    costs: the policy's StepCosts. The queries take the acceptance estimates
    (acceptance.AcceptanceEstimates) they are asked about."""

    def __init__(self, max_k: int, config, min_verified: float, costs):
        self.max_k, self.min_verified, self.costs = max_k, min_verified, costs
        self.hysteresis, self.optimism = config.hysteresis, config.optimism
        self.cost_share = config.cost_share
        self.explore_budget, self.explore_costs = config.explore_budget, config.explore_costs
        self.reset(config.decay)

    def __eq__(self, other) -> bool:      # a policy's state compares by value (copies in tests)
        return isinstance(other, Exploring) and vars(self) == vars(other)

    def reset(self, decay: float) -> None:
        """A fresh budget (nothing spent)."""
        self.budget = ExploreBudget(decay)

    def spent(self) -> float:
        """The share of the decode steps' predicted cost that exploring spent (ExploreBudget)."""
        return self.budget.spent()

    def exhausted(self) -> bool:
        """Whether exploring has spent its budget (explore_budget): it pauses."""
        return self.spent() >= self.explore_budget

    def cost_unlearned(self, k: int, batch_size: int) -> bool:
        """Whether k's cost at batch_size is still the calibration's alone: explore_costs, k <=
        max_k, and k is not among the cost model's known ratios (StepCosts._known_ratios)."""
        return (self.explore_costs and self.costs.step_costs is not None and k <= self.max_k
                and all(j != k for j, _ in self.costs._known_ratios(batch_size)))

    def target(self, est, k: int, batch_size: int, top: int, mix: list[float] | None,
               extra: list[float] | None = None) -> int | None:
        """The depth explored beyond k at batch_size (None: none): `depth`, else k + 1 where its
        step cost is unlearned (`cost_unlearned`) and k + 1 would beat k by more than the
        hysteresis with every draft at position k + 1 accepted and its cost over k's `cost_share`
        of the predicted one (where even that cannot pay, measuring it changes no choice); None
        while the budget is spent. extra: an admission's module prefill per output token at each
        depth (`with_prefill`), which the explored depth must pay too."""
        if self.exhausted():
            return None
        found = self.depth(est, k, batch_size, top, mix, extra)
        if found is None and k < min(top, self.max_k) and self.cost_unlearned(k + 1, batch_size) \
                and self.could_pay(est, k, batch_size, self.cost_share, extra):
            found = k + 1
        return found

    def depth(self, est, k: int, batch_size: int, top: int | None = None, mix: list[float] | None = None,
              extra: list[float] | None = None) -> int | None:
        """The depth k' in k + 1 .. top (None: max_k) whose acceptance is explored at batch_size, or
        None: the smallest k' with an unlearned position in k + 1 .. k' (in a bucket holding 5% of
        mix) that, with the unlearned positions at their upper estimates (`optimism`), would beat
        k by more than the hysteresis for the mix (less is never chosen: the step's k would not
        change, and exploring would only cost; the smallest, as a probe and a held depth cost the
        more the deeper they are, and a deeper one follows once these are learned); extra: an
        admission's module prefill per output token at each k (`with_prefill`)."""
        top = self.max_k if top is None else min(top, self.max_k)
        if self.costs.step_costs is None or k >= top:
            return None
        b = max(1, batch_size)
        curve = self.costs.step_cost_curve(b)

        def goodput(j: int, tokens: float) -> float:
            g = b * tokens / curve[j]
            return with_prefill([g], [extra[j]])[0] if extra else g
        first = next((i for i in range(k, top) if est.unlearned(i, self.min_verified, mix)), None)
        if first is None:                           # position first + 1 is the first unlearned
            return None
        base = goodput(k, est.expected_tokens(k, mix))
        upper = est.expected_tokens_upto(top, mix, k, self.optimism, self.min_verified)
        for j in range(first + 1, top + 1):
            if goodput(j, upper[j]) > (1 + self.hysteresis) * base:
                return j
        return None

    def explores(self, est, k: int, batch_size: int) -> bool:
        """Whether a depth beyond k is explored at batch_size for its acceptance (`depth`)."""
        return self.depth(est, k, batch_size) is not None

    def could_pay(self, est, k: int, batch_size: int, share: float,
                  extra: list[float] | None = None) -> bool:
        """Whether k + 1 beats k at batch_size by more than the hysteresis (less is never chosen) with
        every draft at position k + 1 accepted and share of its predicted cost over k's; extra: as
        in `depth`."""
        b = max(1, batch_size)
        curve, survive, tokens = self.costs.step_cost_curve(b), 1.0, est.expected_tokens(k)
        for p in est.pooled[:k]:
            survive *= p
        cost = curve[k] + share * (curve[k + 1] - curve[k])
        g = [b * tokens / curve[k], b * (tokens + survive) / cost]
        if extra:
            g = with_prefill(g, extra[k:k + 2])
        return g[1] > (1 + self.hysteresis) * g[0]
