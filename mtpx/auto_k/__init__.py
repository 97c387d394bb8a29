"""The draft-length policy: how many drafts each engine step proposes, a fixed
num_speculative_tokens (`FixedDraftLength`) or `num_speculative_tokens=auto` (`AutoDraftLength`).
The scheduler calls a policy through `plan(StepView) -> StepPlan` and `observe(StepRecord)`
(mtpx/core/step_plan.py) and reads its `max_k`; everything else goes through this package's
functions. No torch.

- policy.py: AutoDraftLength (the decisions, its module doc gives the rules) and AutoKConfig (its
  knobs); fixed.py: FixedDraftLength; choices.py: the decisions before they are committed;
  tree_choice.py: AutoChainOrTree, automatic k choosing per step between its chain and a leaf tree.
- AutoDraftLength's parts, objects it holds that own their state: acceptance.py (the acceptance
  estimates, per age), cost_learning.py with cost_curve.py and cost_model_log.py (StepCosts: the
  step-cost model, its online corrections and its predicted-vs-measured log), exploring.py
  (Exploring and its budget), settled.py (SettledDecisions), request_k.py (PerRequestK); the
  admission rules (admission.py) are functions of the policy without state; summary.py writes
  metrics.json's auto_k.
- calibration.py: the start-up measurement of the step costs and the module prefill through the
  model runner's public decode and execute calls, and the forced-k dummy steps of warm-up;
  store.py: the saved step-cost file; costs.py: the offline goodput model.
"""
from __future__ import annotations

from mtpx.auto_k.fixed import FixedDraftLength
from mtpx.auto_k.config import AutoKConfig
from mtpx.auto_k.policy import AutoDraftLength

__all__ = ["AutoDraftLength", "AutoKConfig", "FixedDraftLength", "for_engine", "summary", "k_histogram",
           "reset_histograms"]


def for_engine(policy: AutoDraftLength | None, k: int, multi_module: bool,
               per_request: bool) -> tuple[AutoDraftLength | FixedDraftLength, bool]:
    """The policy an engine whose speculator drafts k runs (None: FixedDraftLength(k)), and
    whether each request has its own depth (automatic k with multi_module MTP). per_request:
    ragged steps with EngineConfig.per_request_k (automatic k's `allocate`). Raises ValueError when
    the policy's max_k is not k."""
    if policy is None:
        return FixedDraftLength(k), False
    if policy.max_k != k:
        raise ValueError(f"automatic k over 0..{policy.max_k} but the speculator drafts {k}")
    policy.per_request = per_request
    return policy, multi_module


def summary(policy) -> dict | None:
    """metrics.json's auto_k: the decisions, estimates and costs (summary.py); None for a fixed k."""
    return policy.summary() if isinstance(policy, AutoDraftLength) else None


def k_histogram(policy) -> dict[int, int]:
    """{k: decode steps that proposed it} since the last reset_histograms."""
    return dict(policy.histogram)


def reset_histograms(policy) -> None:
    """Forget the histograms (and automatic k's predicted-vs-measured log): a measured pass starts."""
    if isinstance(policy, AutoDraftLength):
        policy.reset_histograms()
    else:
        policy.histogram.clear()
