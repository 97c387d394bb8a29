"""Human-readable tables of the metrics dict from :func:`mtpx.metrics.stats.compute_metrics`.

The row set and labels imitate the published MTP1-vs-MTP8 tables (the multi-module MTP reference benchmark,
MTP1 against MTP8) and vLLM's ``benchmark_serving`` printout. Fractions in the metrics dict
(``acceptance_rate``, ``per_position_acceptance``, ``accuracy``, ``prefix_cache_hit_rate``) are shown as
percentages. A value that is None or missing prints as "—" (the prefix cache hit rate of a run without prefix
caching, the latencies of metrics files written before they existed).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import NamedTuple

from rich import box
from rich.console import Console
from rich.table import Table

from mtpx.metrics.tree_metrics import tree_report_rows

__all__ = ["format_report", "format_category_table", "format_cost_model_table", "format_comparison", "DASH"]

DASH = "—"


def _requests(m: dict) -> str | None:
    """"1319 / 0": successful / failed requests."""
    if m.get("num_requests") is None:
        return None
    failed = m.get("num_failed") or 0
    return f"{m['num_requests'] - failed} / {failed}"


def _accuracy(m: dict) -> str | None:
    """"95.45% (1259/1319)"; the count is shown when the caller added ``num_correct``."""
    if m.get("accuracy") is None:
        return None
    text = f"{m['accuracy'] * 100:.2f}%"
    if m.get("num_correct") is not None and m.get("num_requests") is not None:
        text += f" ({m['num_correct']}/{m['num_requests']})"
    return text


def _hit_rate(m: dict) -> str | None:
    """"84.12% (716,992 / 852,381 tokens)": prefix-cache hit rate with cached / prompt tokens;
    None (shown "—") when prefix caching was off."""
    if m.get("prefix_cache_hit_rate") is None:
        return None
    text = f"{m['prefix_cache_hit_rate'] * 100:.2f}%"
    if m.get("num_cached_tokens") is not None and m.get("num_prompt_tokens") is not None:
        text += f" ({m['num_cached_tokens']:,} / {m['num_prompt_tokens']:,} tokens)"
    return text


class _Row(NamedTuple):
    """One table row.

    ``fmt`` is a format spec applied to ``metrics[key]`` ("%" = a fraction shown as a percentage
    with 2 decimals) or a function of the whole metrics dict. ``delta`` says how a two-run
    comparison shows the change: "rel" = relative change in %, "pts" = difference in percentage
    points, "" = none.
    """

    label: str
    key: str
    fmt: str | Callable[[dict], str | None]
    delta: str = ""


def _k_histogram(m: dict) -> str | None:
    """num_speculative_tokens=auto: "k: % of decode steps" for every k chosen, e.g. "0: 12.5 · 8: 87.5"."""
    hist = m.get("k_histogram")
    if not hist:
        return None
    total = sum(hist.values())
    return " · ".join(f"{k}: {100 * n / total:.1f}"
                      for k, n in sorted(hist.items(), key=lambda kv: int(kv[0])))


def _depth_histogram(m: dict) -> str | None:
    """num_speculative_tokens=auto: "depth: % of requests" for every draft depth a request was
    admitted with (metrics["auto_k"]["depth_histogram"]), e.g. "2: 25.0 · 4: 75.0"."""
    hist = (m.get("auto_k") or {}).get("depth_histogram")
    if not hist:
        return None
    total = sum(hist.values())
    return " · ".join(f"{d}: {100 * n / total:.1f}"
                      for d, n in sorted(hist.items(), key=lambda kv: int(kv[0])))


def _verified_histogram(m: dict) -> str | None:
    """Per-request k (automatic k, ragged steps): "drafts: % of request-steps" for the drafts each
    request verified in each step (metrics["auto_k"]["verified_histogram"]), e.g. "0: 20.0 · 4: 80.0"."""
    hist = (m.get("auto_k") or {}).get("verified_histogram")
    if not hist:
        return None
    total = sum(hist.values())
    return " · ".join(f"{d}: {100 * n / total:.1f}"
                      for d, n in sorted(hist.items(), key=lambda kv: int(kv[0])))


PER_POSITION = "per_position_acceptance"  # this key expands to one or several rows, see below
_ROWS: list[_Row] = [
    _Row("Successful / failed requests", "num_requests", _requests),
    _Row("Accuracy", "accuracy", _accuracy, "pts"),
    _Row("Acceptance rate (%)", "acceptance_rate", "%", "pts"),
    _Row("Acceptance length", "acceptance_length", ".2f", "rel"),
    _Row("Drafts", "num_drafts", ",d", "rel"),
    _Row("Draft tokens", "num_draft_tokens", ",d", "rel"),
    _Row("Accepted tokens", "num_accepted_tokens", ",d", "rel"),
    _Row("Committed tokens", "num_committed_tokens", ",d", "rel"),
    _Row("Per-position acceptance (%)", PER_POSITION, "", "pts"),
    _Row("Drafts per step, k (% of steps)", "k_histogram", _k_histogram),
    _Row("Draft depth per request (% of requests)", "depth_histogram", _depth_histogram),
    _Row("Drafts verified per request and step (%)", "verified_histogram", _verified_histogram),
    _Row("Prefix cache hit rate", "prefix_cache_hit_rate", _hit_rate, "pts"),
    _Row("Preemptions", "num_preemptions", ",d", "rel"),
    _Row("Mean TTFT (ms)", "mean_ttft_ms", ".2f", "rel"),
    _Row("Median TTFT (ms)", "median_ttft_ms", ".2f", "rel"),
    _Row("P99 TTFT (ms)", "p99_ttft_ms", ".2f", "rel"),
    _Row("Mean TPOT (ms)", "mean_tpot_ms", ".2f", "rel"),
    _Row("Median TPOT (ms)", "median_tpot_ms", ".2f", "rel"),
    _Row("P99 TPOT (ms)", "p99_tpot_ms", ".2f", "rel"),
    _Row("Mean ITL (ms)", "mean_itl_ms", ".2f", "rel"),
    _Row("Median ITL (ms)", "median_itl_ms", ".2f", "rel"),
    _Row("P99 ITL (ms)", "p99_itl_ms", ".2f", "rel"),
    _Row("Mean E2EL (ms)", "mean_e2el_ms", ".2f", "rel"),
    _Row("Median E2EL (ms)", "median_e2el_ms", ".2f", "rel"),
    _Row("P99 E2EL (ms)", "p99_e2el_ms", ".2f", "rel"),
    _Row("Request throughput (req/s)", "request_throughput", ".2f", "rel"),
    _Row("Output token throughput (tok/s)", "output_throughput", ".2f", "rel"),
    _Row("Benchmark duration (s)", "duration_s", ".2f", "rel"),
    _Row("Lossless mismatches", "lossless_mismatches", "d"),
    _Row("Lossless near-ties", "lossless_near_ties", lambda m: None if m.get("lossless_near_ties") is None
         else str(len(m["lossless_near_ties"]))),
    _Row("Plain decoding throughput (tok/s)", "plain_output_throughput", ".2f", "rel"),
    _Row("Speculative / plain throughput", "speculative_speedup",
         lambda m: None if m.get("speculative_speedup") is None else f"{m['speculative_speedup']:.2f}x"),
    _Row("Acceptance rule (LOSSY)", "acceptance", lambda m: m.get("acceptance")),
    _Row("Lossless rule throughput (tok/s)", "lossless_output_throughput", ".2f", "rel"),
    _Row("Lossless rule acceptance length", "lossless_acceptance_length", ".2f", "rel"),
    _Row("Speed-up vs lossless rule", "speedup_vs_lossless", ".3f", "rel"),
    _Row("Identical to lossless (%)", "quality", lambda m: _q(m, "identical_share", "{:.1%}")),
    _Row("Mean first difference (token)", "quality", lambda m: _q(m, "mean_first_difference", "{:.1f}")),
    _Row("Log-likelihood / token: rule, lossless", "quality", lambda m: _pair(m, "log_likelihood", "{:.4f}")),
    _Row("Log-likelihood loss (95% CI)", "quality", lambda m: _ci(m, "log_likelihood_loss", "{:.4f}")),
    _Row("Task accuracy: rule, lossless", "quality", lambda m: _pair(m, "accuracy", "{:.1%}")),
    _Row("Accuracy loss (95% CI)", "quality", lambda m: _ci(m, "accuracy_loss", "{:.3f}")),
    _Row("TV distance (noise floor)", "quality",
         lambda m: None if _q(m, "tv_distance", "") is None
         else f"{m['quality']['tv_distance']:.3f} ({m['quality']['tv_distance_floor']:.3f})"),
]
# rows left out when no run has a value
_OPTIONAL_KEYS = ("k_histogram", "depth_histogram", "verified_histogram", "accuracy", "lossless_mismatches",
                  "lossless_near_ties", "plain_output_throughput", "speculative_speedup", "acceptance",
                  "lossless_output_throughput", "lossless_acceptance_length", "speedup_vs_lossless",
                  "quality")
# Keys the rows display; any other scalar key a caller added gets a row named by its key.
# (chat_template: whether a chat set went through the chat template; the run's title says so.)
_SHOWN_KEYS = {r.key for r in _ROWS} | {"num_failed", "num_correct", "num_cached_tokens",
                                         "num_prompt_tokens", "chat_template", "lossy", "quality_gate"}


def _q(m: dict, key: str, fmt: str) -> str | None:
    """A lossy rule's quality value (mtpx/evaluate/quality.py), formatted; None when not measured."""
    q = m.get("quality")
    value = q.get(key) if isinstance(q, dict) else None
    return None if value is None else fmt.format(value)


def _pair(m: dict, key: str, fmt: str) -> str | None:
    a, b = _q(m, key, fmt), _q(m, key + "_lossless", fmt)
    return None if a is None else f"{a}, {b or DASH}"


def _ci(m: dict, key: str, fmt: str) -> str | None:
    value, ci = _q(m, key, fmt), _q(m, key + "_interval", "{}")
    if value is None:
        return None
    lo, hi = m["quality"][key + "_interval"] or (None, None)
    return value + ("" if lo is None else f" [{fmt.format(lo)}, {fmt.format(hi)}]") if ci else value


def _cell(row: _Row, m: dict) -> str | None:
    """The formatted value of ``row`` for metrics ``m``; None when missing or None."""
    if callable(row.fmt):
        return row.fmt(m)
    value = m.get(row.key)
    if value is None:
        return None
    return f"{value * 100:.2f}" if row.fmt == "%" else format(value, row.fmt)


def _extra_keys(metrics_list: list[dict]) -> list[str]:
    """Caller-added scalar keys, in first-seen order."""
    keys: list[str] = []
    for m in metrics_list:
        for k, v in m.items():
            if k not in _SHOWN_KEYS and k not in keys and isinstance(v, (int, float, str, type(None))):
                keys.append(k)
    return keys


def _fmt_extra(value: object) -> str:
    """A caller-added value: floats with 4 significant digits, None as "—"."""
    if value is None:
        return DASH
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _position(m: dict, i: int) -> float | None:
    """Acceptance fraction at draft position ``i``; None past the run's last position."""
    values = m.get(PER_POSITION) or []
    return values[i] if i < len(values) else None


def _report_rows(m: dict) -> list[tuple[str, str]]:
    """(label, value) rows of one run; per-position acceptance is one row "75.6 / 60.1 / ..."."""
    rows: list[tuple[str, str]] = []
    for row in _ROWS:
        if row.key == PER_POSITION:
            values = m.get(PER_POSITION) or []
            joined = " / ".join(DASH if v is None else f"{v * 100:.1f}" for v in values)
            rows.append((row.label, joined or DASH))
            continue
        value = _cell(row, m)
        if value is None and row.key in _OPTIONAL_KEYS:
            continue
        rows.append((row.label, DASH if value is None else value))
    rows += tree_report_rows(m)
    rows += [(k, _fmt_extra(m.get(k))) for k in _extra_keys([m])]
    return rows


def format_report(metrics: dict, title: str, width: int = 100) -> str:
    """Render one run's metrics as a plain-text table (rich, exported without colour).

    When ``metrics["analytics"]["by_category"]`` (:mod:`mtpx.metrics.analytics`) holds more than
    one category, the acceptance-by-category table (:func:`format_category_table`) follows.

    Args:
        metrics: a dict from ``compute_metrics``, optionally with ``accuracy`` (fraction in
            [0, 1]), ``num_correct``, ``analytics`` and other caller-added scalar keys (shown by
            key name).
        title: printed above the table.
        width: console width in characters.

    Returns:
        The table as text, e.g. a row "Per-position acceptance (%)   75.6 / 60.1 / 49.8".
    """
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("Metric")
    table.add_column("Value", justify="right")
    for label, value in _report_rows(metrics):
        table.add_row(label, value)
    text = _render(table, width)
    by_category = (metrics.get("analytics") or {}).get("by_category") or {}
    if len(by_category) > 1:
        text += "\n" + format_category_table(by_category, width)
    by_constraint = (metrics.get("structured_outputs") or {}).get("by_constraint") or {}
    if by_constraint:               # structured output (docs/structured_output.md)
        text += "\n" + format_constraint_table(metrics["structured_outputs"], width)
    cost_model = (metrics.get("auto_k") or {}).get("cost_model") or {}
    if any(row.get("steps") for row in cost_model.values()):
        text += "\n" + format_cost_model_table(cost_model, width)
    if (estimate := (metrics.get("auto_k") or {}).get("run_estimate")) is not None:
        text += "\n" + format_run_estimate(estimate) + "\n"
    return text


def format_run_estimate(e: dict) -> str:
    """Automatic k's decode against the cost model's estimate of plain decoding and of the best
    fixed k on the run's own decode steps (metrics["auto_k"]["run_estimate"],
    StepCosts.run_estimate), one line."""
    got = e["measured_tokens_per_s"]
    return (f"Decode tok/s, this run's steps: automatic k measured {got:.1f}; the cost model's estimate "
            f"of plain decoding {e['plain_tokens_per_s']:.1f} ({got / e['plain_tokens_per_s']:.3f}x) "
            f"and of the best fixed k = {e['best_fixed_k']} {e['best_fixed_tokens_per_s']:.1f} "
            f"({got / e['best_fixed_tokens_per_s']:.3f}x)")


def format_cost_model_table(cost_model: dict[str, dict], width: int = 100) -> str:
    """Automatic k's cost model against the running engine: one row per batch bucket with
    compared steps (metrics["auto_k"]["cost_model"], mtpx/auto_k/cost_model_log.py): the decode
    steps and the pure decode steps compared, the predicted and measured speed-up over k = 0, the
    mean predicted and measured step ms, and where the measured speed-up's k = 0 step comes from
    ("measured (n)" over the bucket's n k = 0 steps, or "calibrated").

    Args:
        cost_model: ``{bucket label: {"decode_steps", "steps", "predicted_speedup", ...}}``.
        width: console width in characters.
    """
    table = Table(title="Cost model: predicted vs measured speed-up over k = 0, per batch size",
                  box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("Batch size", "Decode steps", "Compared", "Predicted speed-up", "Measured speed-up",
                 "Predicted ms", "Measured ms", "k = 0 step"):
        table.add_column(name, justify="left" if name in ("Batch size", "k = 0 step") else "right",
                         no_wrap=name == "k = 0 step")
    for label, row in cost_model.items():
        if not row.get("steps"):
            continue
        plain = row["plain_step_ms_source"]
        if plain == "measured":
            plain += f" ({row['plain_steps']})"
        table.add_row(label, str(row["decode_steps"]), str(row["steps"]), f"{row['predicted_speedup']:.3f}x",
                      f"{row['measured_speedup']:.3f}x", f"{row['predicted_step_ms']:.2f}",
                      f"{row['measured_step_ms']:.2f}", plain)
    return _render(table, width)


def format_category_table(by_category: dict[str, dict], width: int = 100) -> str:
    """The acceptance-by-category table: one row per category (in the dict's order) with its
    requests ("4 (1 failed)" when the entry has a non-zero ``num_failed``), acceptance rate (%)
    and acceptance length; "—" where a category had no drafts.

    Args:
        by_category: ``{category: {"num_requests", "acceptance_rate", "acceptance_length", ...}}``
            as :func:`mtpx.metrics.analytics.by_category` returns it (evaluate adds ``num_failed``).
        width: console width in characters.
    """
    table = Table(title="Acceptance by category", box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (("Category", "left"), ("Requests", "right"),
                          ("Acceptance rate (%)", "right"), ("Acceptance length", "right")):
        table.add_column(name, justify=justify)
    for category, v in by_category.items():
        rate, length = v.get("acceptance_rate"), v.get("acceptance_length")
        requests = str(v.get("num_requests", DASH))
        if v.get("num_failed"):
            requests += f" ({v['num_failed']} failed)"
        table.add_row(str(category), requests,
                      DASH if rate is None else f"{rate * 100:.2f}",
                      DASH if length is None else f"{length:.2f}")
    return _render(table, width)


def format_constraint_table(so: dict, width: int = 100) -> str:
    """metrics["structured_outputs"] (mtpx.evaluate.measure.structured_metrics) as a table: per
    constraint label its requests, acceptance length and per-position acceptance (%), and the
    grammar masks' host time per step (ms) in the title."""
    title = (f"Acceptance by constraint (grammar masks {so['mask_ms_per_step']:.3f} ms/step on the target, "
             f"{so['draft_mask_ms_per_step']:.3f} on the drafts)")
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (("Requests", "left"), ("Count", "right"), ("Acceptance length", "right"),
                          ("Per-position acceptance (%)", "left")):
        table.add_column(name, justify=justify)
    for label, v in so["by_constraint"].items():
        length = v.get("acceptance_length")
        per = " / ".join(DASH if x is None else f"{100 * x:.1f}"
                         for x in v.get("per_position_acceptance") or [])
        table.add_row(label, str(v["num_requests"]), DASH if length is None else f"{length:.2f}", per or DASH)
    return _render(table, width)


def _render(table: Table, width: int) -> str:
    """A rich table as plain text, trailing spaces stripped, newline-terminated."""
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(table)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def _comparison_rows(runs: list[dict]) -> list[list[str]]:
    """Rows [label, value per run, (Δ when two runs)]; one row per draft position."""
    with_delta = len(runs) == 2
    lines: list[list[str]] = []

    def add(label: str, cells: list[str | None], raw: list | None, kind: str) -> None:
        line = [label, *(DASH if c is None else c for c in cells)]
        if with_delta:
            line.append(_delta(raw[0], raw[1], kind) if raw and kind else DASH)
        lines.append(line)

    for row in _ROWS:
        if row.key == PER_POSITION:
            for i in range(max(len(m.get(PER_POSITION) or []) for m in runs)):
                values = [_position(m, i) for m in runs]
                cells = [None if v is None else f"{v * 100:.2f}" for v in values]
                add(f"{row.label} — Pos {i}", cells, values, row.delta)
            continue
        cells = [_cell(row, m) for m in runs]
        if all(c is None for c in cells) and row.key in _OPTIONAL_KEYS:
            continue
        add(row.label, cells, [m.get(row.key) for m in runs], row.delta)
    for k in _extra_keys(runs):
        add(k, [_fmt_extra(m.get(k)) for m in runs], None, "")
    return lines


def format_comparison(rows: dict[str, dict]) -> str:
    """Render several runs side by side as a GitHub-markdown table (columns = run names).

    Per-position acceptance gets one row per position ("Per-position acceptance (%) — Pos i",
    up to the longest run); runs with fewer positions show "—". With exactly two runs a "Δ"
    column follows, second run vs first: the relative change for counts, latencies and
    throughput ("+30.5%"), the difference in percentage points for rates ("-7.91 pts").

    Args:
        rows: run name -> metrics dict (as for :func:`format_report`), in column order.

    Returns:
        The markdown table, newline-terminated.

    Raises:
        ValueError: ``rows`` is empty.
    """
    if not rows:
        raise ValueError("format_comparison needs at least one run: pass {run name: metrics dict}")
    header = ["Metric", *rows] + (["Δ"] if len(rows) == 2 else [])
    out = [_md_row(header), "| --- |" + " ---: |" * (len(header) - 1)]
    out += [_md_row(r) for r in _comparison_rows(list(rows.values()))]
    return "\n".join(out) + "\n"


def _delta(a: float | None, b: float | None, kind: str) -> str:
    """Change from ``a`` to ``b``: "+30.5%" (kind "rel") or "-7.91 pts" (kind "pts"); "—" if undefined."""
    if a is None or b is None:
        return DASH
    if kind == "pts":
        return f"{(b - a) * 100:+.2f} pts"
    if a == 0:
        return DASH
    return f"{(b - a) / a * 100:+.1f}%"


def _md_row(cells: list[str]) -> str:
    """One markdown table row; "|" inside a cell is escaped."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
