"""Speculative-decoding metrics (vLLM definitions), report tables, and W&B / plot logging."""

from mtpx.metrics.logging import RunLogger, plot_per_position_acceptance
from mtpx.metrics.report import format_comparison, format_report
from mtpx.metrics.stats import (
    METRIC_KEYS,
    RequestOutput,
    SpecDecodeCounts,
    aggregate_spec,
    compute_metrics,
    is_failed,
)

__all__ = [
    "METRIC_KEYS",
    "RequestOutput",
    "SpecDecodeCounts",
    "aggregate_spec",
    "compute_metrics",
    "is_failed",
    "format_report",
    "format_comparison",
    "RunLogger",
    "plot_per_position_acceptance",
]
