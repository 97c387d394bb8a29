"""Automatic k's knobs (`AutoKConfig`), their defaults the ones measured best on the demo
(docs/automatic_k.md). LLM builds AutoDraftLength with the defaults."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["AutoKConfig"]


@dataclass(frozen=True)
class AutoKConfig:
    """Automatic k's knobs (module doc), the defaults measured best on the demo."""

    decay: float = 0.99
    """Per-step discount of the acceptance counts."""
    prior_weight: float = 8.0
    """Pseudo-drafts of acceptance prior_acceptance in each estimate."""
    hysteresis: float = 0.05
    """Relative goodput margin for the k in use (or a running depth) to fall."""
    rise_hysteresis: float = 0.02
    """Relative goodput margin for the k in use to rise."""
    probe_interval: int = 32
    """Steps between probes of one draft more or fewer (0: none)."""
    cost_window: int = 15
    """Measured steps whose median is a cost correction."""
    cost_decay: float = 0.999
    """Per step since a k's cost was last measured, its correction fades toward the level's."""
    prior_acceptance: float = 0.7
    """The acceptance every estimate starts at."""
    patience: int = 8
    """Consecutive steps that must predict a change of the k in use, or a depth's fall."""
    min_cost_observations: int = 8
    """Measured steps of a (k, batch bucket) before its own cost correction applies."""
    min_verified: float | None = None
    """Discounted verified drafts below which a position is unlearned and explored (None:
    prior_weight; 0: never)."""
    explore_costs: bool = True
    """Explore a neighbour k whose cost is unmeasured at the batch size where it could pay."""
    optimism: float = 1.0
    """Standard deviations above an estimate at which exploring values an unlearned position."""
    cost_share: float = 0.8
    """The share of its predicted extra cost at which an unmeasured k + 1 must still pay."""
    explore_budget: float = 0.001
    """The share of the predicted step time exploring may spend before it pauses (1: no limit)."""
    optimistic_falls: bool = True
    """A fall lands where the upper estimates pay most (`_landing`), else on the best k."""
    admission_landing: Literal["batch", "request", "off"] = "request"
    """Where an admission below the k in use lands: batch, request or off (checked by
    AutoDraftLength)."""
    patient_start: bool = False
    """The first step after a reset waits `patience` steps to fall, as every other."""
    free_landing_lead: float = 0.1
    """In a batch, an admission landing on an upper lead of at most this is exploring's to pay."""
    settled_interval: int = 4
    """Steps a settled decision holds (1: none)."""
