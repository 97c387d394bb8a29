"""Per-request generation parameters (vLLM's `SamplingParams` names)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """max_tokens: output tokens at most; temperature: 0 = greedy (the only mode so far);
    stop_token_ids: generation ends after emitting one of these (the eos id is added unless
    ignore_eos). Raises ValueError on values the engine cannot honour."""

    max_tokens: int = 128
    temperature: float = 0.0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens}: must be >= 1")
        if self.temperature != 0.0:
            raise ValueError(f"temperature={self.temperature}: mtpx decodes greedily so far; "
                             "use temperature=0")
