"""What the cost model of automatic k predicted against what the engine measured, per batch-size
bucket (`CostModelLog`, kept by AutoDraftLength and written to metrics.json as
``auto_k.cost_model``). Pure Python: no I/O, no tensors.

A bucket is a power-of-two range of batch sizes (`batch_bucket`: 1, 2-3, 4-7, ..., 64-127): the
policy's online cost correction is kept per (k, bucket) too.

For the steps of a bucket the log compares two speed-ups over plain decoding (k = 0) at the same
batch sizes, each a ratio of throughputs summed over the steps (so a long step weighs more):

    predicted_speedup = (sum B E[tokens | k] / sum cost(k, B)) / (sum B / sum cost(0, B))
    measured_speedup  = (sum tokens / sum step_ms)           / (sum B / sum plain_ms(B))

with E[tokens | k] and cost(., B) the policy's estimates the step's k was chosen with (draft_length.py),
tokens the tokens the step's verification committed (accepted drafts plus the target's token,
per request) and step_ms its measured wall time (verify + draft, StepTiming). plain_ms(B) is the
calibrated k = 0 cost at B times rho, where rho = (measured / calibrated) over the bucket's own
k = 0 steps when it had any ("plain_step_ms_source": "measured"), else 1 ("calibrated").
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["batch_bucket", "bucket_label", "CostModelLog"]


def batch_bucket(batch_size: int) -> int:
    """The bucket of a batch size >= 1: its lower bound, the largest power of two <= batch_size."""
    return 1 << (max(1, batch_size).bit_length() - 1)


def bucket_label(bucket: int) -> str:
    """"1", "2-3", "4-7", ... (batch sizes, both ends included)."""
    return "1" if bucket == 1 else f"{bucket}-{2 * bucket - 1}"


@dataclass
class _Sums:
    decode_steps: int = 0            # every decode step of the bucket (the ones compared: steps)
    steps: int = 0                   # pure decode steps compared
    requests: int = 0                # sum of B
    predicted_tokens: float = 0.0    # sum of B E[tokens | k]
    predicted_ms: float = 0.0        # sum of cost(k, B)
    predicted_plain_ms: float = 0.0  # sum of cost(0, B)
    tokens: int = 0                  # committed
    step_ms: float = 0.0             # measured
    calibrated_plain_ms: float = 0.0  # sum of calibrated k = 0 cost at B
    plain_steps: int = 0             # k = 0 steps among them
    plain_ms: float = 0.0            # their measured ms
    plain_calibrated_ms: float = 0.0  # their calibrated ms


@dataclass
class CostModelLog:
    """Per batch bucket: the predicted and measured step costs and speed-ups (module doc)."""

    _sums: dict[int, _Sums] = field(default_factory=dict)
    batch_sizes: Counter = field(default_factory=Counter)    # every decode step's batch size -> steps
    decode_tokens: int = 0                                   # tokens the timed decode steps committed
    decode_ms: float = 0.0                                   # their verification, draft round, catch-up

    def clear(self) -> None:
        self._sums.clear()
        self.batch_sizes.clear()
        self.decode_tokens, self.decode_ms = 0, 0.0

    def count_decode_step(self, batch_size: int) -> None:
        """A decode step of batch_size requests (compared or not)."""
        self._bucket(batch_size).decode_steps += 1
        self.batch_sizes[batch_size] += 1

    def add_decode(self, num_tokens: int, ms: float) -> None:
        """A timed decode step (pure or beside a prefill) committed num_tokens in ms of decoding."""
        self.decode_tokens += num_tokens
        self.decode_ms += ms

    def add(self, k: int, batch_size: int, expected_tokens: float, predicted_ms: float,
            predicted_plain_ms: float, calibrated_plain_ms: float, num_tokens: int, step_ms: float) -> None:
        """One pure decode step: batch_size requests at k drafts, what the policy predicted (tokens
        per request, step ms at k and at 0) and what it measured (tokens committed, step ms);
        calibrated_plain_ms: the start-up calibration's k = 0 cost at batch_size."""
        s = self._bucket(batch_size)
        s.steps += 1
        s.requests += batch_size
        s.predicted_tokens += batch_size * expected_tokens
        s.predicted_ms += predicted_ms
        s.predicted_plain_ms += predicted_plain_ms
        s.tokens += num_tokens
        s.step_ms += step_ms
        s.calibrated_plain_ms += calibrated_plain_ms
        if k == 0:
            s.plain_steps += 1
            s.plain_ms += step_ms
            s.plain_calibrated_ms += calibrated_plain_ms

    def _bucket(self, batch_size: int) -> _Sums:
        b = batch_bucket(batch_size)
        if (sums := self._sums.get(b)) is None:
            sums = self._sums[b] = _Sums()
        return sums

    def summary(self) -> dict:
        """{bucket label: {decode_steps, steps, predicted_tokens_per_request,
        measured_tokens_per_request, predicted_step_ms, measured_step_ms, predicted_speedup,
        measured_speedup, plain_step_ms_source, plain_steps}} in bucket order; the values of a
        bucket without compared steps are None (module doc)."""
        out = {}
        for b, s in sorted(self._sums.items()):
            row = {"decode_steps": s.decode_steps, "steps": s.steps}
            if s.steps:
                rho = s.plain_ms / s.plain_calibrated_ms if s.plain_steps else 1.0
                plain_throughput = s.requests / (rho * s.calibrated_plain_ms)
                row |= {"predicted_tokens_per_request": round(s.predicted_tokens / s.requests, 4),
                        "measured_tokens_per_request": round(s.tokens / s.requests, 4),
                        "predicted_step_ms": round(s.predicted_ms / s.steps, 4),
                        "measured_step_ms": round(s.step_ms / s.steps, 4),
                        "predicted_speedup": round(s.predicted_tokens * s.predicted_plain_ms
                                                   / (s.predicted_ms * s.requests), 4),
                        "measured_speedup": round(s.tokens / s.step_ms / plain_throughput, 4),
                        "plain_step_ms_source": "measured" if s.plain_steps else "calibrated",
                        "plain_steps": s.plain_steps}
            else:
                row |= dict.fromkeys(("predicted_tokens_per_request", "measured_tokens_per_request",
                                      "predicted_step_ms", "measured_step_ms", "predicted_speedup",
                                      "measured_speedup", "plain_step_ms_source"))
                row["plain_steps"] = 0
            out[bucket_label(b)] = row
        return out
