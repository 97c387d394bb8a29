"""The benchmark metrics of a run, computed from its requests' speculative-decoding counters and
times (the output types live in mtpx.outputs and are re-exported here).

Definitions follow vLLM (docs/architecture.md, invariant 7):

- vLLM ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingStats`` / ``SpecDecodingLogging``):
  ``num_drafts`` counts verification rounds with at least one draft token; acceptance rate =
  accepted / draft tokens; per-position acceptance[i] = rounds whose i-th draft was accepted /
  num_drafts. These counters are the verifier's raw counts.
- Mean acceptance length = committed tokens / num_drafts: the tokens those rounds appended to the
  output, the bonus token included. This is 1 + accepted / num_drafts except in a round that ends
  at a stop token (or max_tokens) inside its accepted drafts: it commits the drafts up to the stop
  and no bonus (vLLM issue #56101 and PR #56137, which adds committed counts beside the raw ones).
- vLLM ``benchmarks/benchmark_serving.py`` (``calculate_metrics``): TTFT is first token time
  minus start; E2EL (end-to-end latency) is finish time minus start; TPOT = (E2EL - TTFT) /
  (output tokens - 1), only for requests with more than one output token; ITL = the gaps between
  consecutive streamed chunks of a request, pooled over all requests (several tokens accepted in one step are
  one chunk, one emission); output throughput = output tokens of successful requests / benchmark duration;
  request throughput = successful requests / benchmark duration.
- vLLM prefix caching: hit rate = prompt tokens served from the prefix cache / prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable, Sequence

import numpy as np

from mtpx.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput, SpecDecodeCounts

__all__ = [
    "SpecDecodeCounts",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestMetrics",
    "METRIC_KEYS",
    "is_failed",
    "aggregate_spec",
    "compute_metrics",
]


METRIC_KEYS: tuple[str, ...] = (
    "num_requests",
    "num_failed",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "num_committed_tokens",
    "acceptance_rate",
    "acceptance_length",
    "per_position_acceptance",
    "num_prompt_tokens",
    "num_cached_tokens",
    "prefix_cache_hit_rate",
    "num_preemptions",
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "duration_s",
    "lossless_mismatches",
)
"""The keys :func:`compute_metrics` returns, in order."""


def is_failed(output: RequestOutput) -> bool:
    """True when ``output`` failed: it has an error message or never got a finish reason."""
    return output.error is not None or output.finish_reason is None


def aggregate_spec(outputs: Iterable[RequestOutput]) -> SpecDecodeCounts:
    """Sum the speculative-decoding counters of ``outputs`` (failed requests included).

    ``accepted_per_position`` is summed element-wise; the result is as long as the longest input.
    """
    total = SpecDecodeCounts()
    for out in outputs:
        s = out.spec
        total.num_drafts += s.num_drafts
        total.num_draft_tokens += s.num_draft_tokens
        total.num_accepted_tokens += s.num_accepted_tokens
        total.num_committed_tokens += s.num_committed_tokens
        if len(total.accepted_per_position) < len(s.accepted_per_position):
            total.accepted_per_position.extend(
                [0] * (len(s.accepted_per_position) - len(total.accepted_per_position))
            )
        for i, n in enumerate(s.accepted_per_position):
            total.accepted_per_position[i] += n
    return total


def compute_metrics(
    outputs: Sequence[RequestOutput],
    duration_s: float,
    num_speculative_tokens: int,
    enable_prefix_caching: bool = False,
) -> dict:
    """Compute the benchmark metrics of one run.

    Args:
        outputs: every request of the run, failed ones included.
        duration_s: benchmark wall time in seconds (> 0).
        num_speculative_tokens: draft tokens per round (k); 0 for plain decoding.
        enable_prefix_caching: whether the engine ran with prefix caching (else the hit rate is None).

    Returns:
        A dict with exactly the keys in :data:`METRIC_KEYS`:

        - ``num_requests``: all requests, failed ones included; ``num_failed``: see :func:`is_failed`.
        - ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` (raw verifier counts),
          ``num_committed_tokens``: summed over all requests (rounds of a request that later
          failed were still verified, as vLLM counts them).
        - ``acceptance_rate``: accepted / draft tokens, in [0, 1]; None when no drafts.
        - ``acceptance_length``: committed tokens / num_drafts (module doc); None when no drafts.
        - ``per_position_acceptance``: ``k`` fractions, ``[i]`` = rounds whose i-th draft was
          accepted / num_drafts; ``k`` Nones when no drafts.
        - ``num_prompt_tokens``, ``num_cached_tokens``: prompt tokens of successful requests, and
          how many of them the prefix cache served (at each request's first admission).
        - ``prefix_cache_hit_rate``: num_cached_tokens / num_prompt_tokens, in [0, 1]; None when
          prefix caching is off or there are no prompt tokens.
        - ``num_preemptions``: times a request's KV blocks were taken back, summed over all requests.
        - ``output_throughput``: output tokens of successful requests / duration, tokens/s.
        - ``request_throughput``: successful requests / duration, requests/s.
        Latencies are in ms; their medians and 99th percentiles use numpy's linear interpolation,
        as vLLM's ``benchmark_serving`` (``np.percentile(values, 99)``).

        - ``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms``: TTFT = first_token_time -
          arrival_time, over successful requests that emitted a token; None if none.
        - ``mean_tpot_ms``, ``median_tpot_ms``, ``p99_tpot_ms``: TPOT = (E2EL - TTFT) / (output
          tokens - 1) over successful requests with >= 2 output tokens; None if none.
        - ``mean_itl_ms``, ``median_itl_ms``, ``p99_itl_ms``: over the gaps between consecutive
          emissions (``emission_times``) of successful requests, pooled; None if no request
          emitted twice.
        - ``mean_e2el_ms``, ``median_e2el_ms``, ``p99_e2el_ms``: E2EL = finish_time -
          arrival_time over successful requests; None if none.
        - ``duration_s``: as given; ``lossless_mismatches``: None (the caller fills it).

        The caller may add keys (``accuracy``, ...) afterwards.

    Raises:
        ValueError: ``duration_s`` <= 0, ``num_speculative_tokens`` < 0, or a request accepted a
            draft at a position >= ``num_speculative_tokens``.
    """
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0 seconds, got {duration_s!r}")
    if num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")

    spec = aggregate_spec(outputs)
    acc = _acceptance(spec, num_speculative_tokens)
    ok = [o for o in outputs if not is_failed(o)]
    return {
        "num_requests": len(outputs),
        "num_failed": len(outputs) - len(ok),
        "num_drafts": spec.num_drafts,
        "num_draft_tokens": spec.num_draft_tokens,
        "num_accepted_tokens": spec.num_accepted_tokens,
        "num_committed_tokens": spec.num_committed_tokens,
        "acceptance_rate": acc.rate,
        "acceptance_length": acc.length,
        "per_position_acceptance": acc.per_position,
        **_prefix_cache_metrics(ok, enable_prefix_caching),
        "num_preemptions": sum(o.num_preemptions for o in outputs),
        "output_throughput": sum(len(o.output_token_ids) for o in ok) / duration_s,
        "request_throughput": len(ok) / duration_s,
        **_latency_metrics(ok),
        "duration_s": duration_s,
        "lossless_mismatches": None,
    }


@dataclass
class _Acceptance:
    """A run's acceptance metrics (vLLM's definitions, module doc); all None without drafts.

    Attributes:
        rate: accepted / draft tokens, in [0, 1].
        length: committed tokens / num_drafts (1 + accepted / num_drafts without stops).
        per_position: ``k`` fractions, ``[i]`` = rounds whose i-th draft was accepted / num_drafts.
    """

    rate: float | None
    length: float | None
    per_position: list[float | None]


def _acceptance(spec: SpecDecodeCounts, num_speculative_tokens: int) -> _Acceptance:
    """The acceptance metrics of the aggregate counters ``spec`` of a run with k =
    ``num_speculative_tokens``.

    Raises:
        ValueError: a draft was accepted at a position >= ``num_speculative_tokens``.
    """
    if len(spec.accepted_per_position) > num_speculative_tokens:
        raise ValueError(
            f"a request accepted a draft at position {len(spec.accepted_per_position) - 1} but "
            f"num_speculative_tokens={num_speculative_tokens}; pass the k the engine ran with"
        )
    per_position: list[int] = spec.accepted_per_position + [0] * (
        num_speculative_tokens - len(spec.accepted_per_position)
    )
    if spec.num_drafts == 0:
        return _Acceptance(None, None, [None] * num_speculative_tokens)
    return _Acceptance(spec.num_accepted_tokens / spec.num_draft_tokens, spec.acceptance_length,
                       [n / spec.num_drafts for n in per_position])


def _prefix_cache_metrics(ok: Sequence[RequestOutput], enable_prefix_caching: bool) -> dict:
    """num_prompt_tokens, num_cached_tokens and prefix_cache_hit_rate (:func:`compute_metrics`)
    over the successful requests ``ok``."""
    num_prompt_tokens = sum(len(o.prompt_token_ids) for o in ok)
    num_cached_tokens = sum(o.num_cached_tokens for o in ok)
    hit_rate = (
        num_cached_tokens / num_prompt_tokens if enable_prefix_caching and num_prompt_tokens else None
    )
    return {"num_prompt_tokens": num_prompt_tokens, "num_cached_tokens": num_cached_tokens,
            "prefix_cache_hit_rate": hit_rate}


def _latency_metrics(ok: Sequence[RequestOutput]) -> dict[str, float | None]:
    """Mean, median and p99 of TTFT, TPOT, ITL and E2EL in ms over the successful requests ``ok``
    (definitions in :func:`compute_metrics`), keyed as :data:`METRIC_KEYS` names them, in its order."""
    ttfts = [
        (o.first_token_time - o.arrival_time) * 1000.0 for o in ok if o.first_token_time is not None
    ]
    e2els = [(o.finish_time - o.arrival_time) * 1000.0 for o in ok if o.finish_time is not None]
    tpots = [
        (o.finish_time - o.first_token_time) * 1000.0 / (len(o.output_token_ids) - 1)  # E2EL - TTFT
        for o in ok
        if len(o.output_token_ids) >= 2 and o.first_token_time is not None and o.finish_time is not None
    ]
    itls = [
        (b - a) * 1000.0 for o in ok for a, b in zip(o.emission_times, o.emission_times[1:])
    ]
    out: dict[str, float | None] = {}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out[f"mean_{name}_ms"] = _mean(values)
        out[f"median_{name}_ms"] = _percentile(values, 50)
        out[f"p99_{name}_ms"] = _percentile(values, 99)
    return out


def _mean(values: list[float]) -> float | None:
    """Arithmetic mean, None for an empty list."""
    return sum(values) / len(values) if values else None


def _percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (numpy's linear interpolation, as vLLM's benchmark); None when empty."""
    return float(np.percentile(values, q)) if values else None
