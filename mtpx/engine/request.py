"""A request's mutable state inside the engine."""
from __future__ import annotations

from dataclasses import dataclass, field

from mtpx.engine.sampling_params import SamplingParams
from mtpx.metrics.stats import SpecDecodeCounts


@dataclass
class Request:
    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset = frozenset()
    row: int = -1
    output_token_ids: list[int] = field(default_factory=list)
    draft_token_ids: list[int] = field(default_factory=list)  # proposed, not yet verified
    spec: SpecDecodeCounts = field(default_factory=SpecDecodeCounts)
    logit_gaps: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt + output."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)
