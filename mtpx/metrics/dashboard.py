"""Figures and tables that explain a run's acceptance, and compare runs and sweeps.

One run (`write_run_figures`, at the end of an eval), from ``metrics["analytics"]``
(mtpx.metrics.analytics):
- ``acceptance_conditional.png``: per-position acceptance, unconditional (rounds whose i-th draft
  was accepted / all rounds, vLLM's definition) beside conditional (/ rounds that verified position
  i), with the rounds that reached each position;
- ``position0_buckets.png``: position-0 acceptance by the same request's previous round (first
  round, 0 .. k-1 accepted, all accepted), with each bar's round count;
- ``acceptance_by_category.png``: acceptance rate and per-position acceptance per prompt category.
A figure without data (no speculation, one category) is not written. With automatic k,
mtpx.metrics.cost_model_figure's figures follow.

Several runs (`load_run`, `write_comparison_figures`, `dashboard_markdown`; tools/dashboard.py):
per-position curves side by side, each run's position-0 buckets, output throughput and median TPOT
against num_speculative_tokens, acceptance by category, and the position-0 prediction of every
ordered pair of spec runs (`position0_predictions`). Run directories are read by
mtpx.metrics.run_dirs, the markdown summary is mtpx.metrics.dashboard_summary's (both re-exported
here), a multirun's table mtpx.metrics.sweep's.

Figures use matplotlib's object API (``Figure`` on the Agg canvas, no pyplot state) and are written
atomically (mtpx.io.atomic_write_bytes). Rates are fractions in the metrics dicts and percentages in
figures and tables.
"""
from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

from mtpx.io import atomic_write_bytes, source_commit, utc_now
from mtpx.metrics.analytics import wilson_interval
from mtpx.metrics.cost_model_figure import write_auto_k_figures
from mtpx.metrics.tree_metrics import write_tree_figure
from mtpx.metrics.dashboard_summary import (dashboard_markdown, format_position0_prediction, md_row,
                                            position0_predictions)
from mtpx.metrics.run_dirs import (Run, RunDirError, bucket_rows, buckets_have_data, categories_with_data,
                                   load_run, load_runs, mixed_runs_warning, provenance, read_metrics,
                                   read_yaml, run_data, run_identity, run_mode)

__all__ = [
    "RUN_FIGURES", "COMPARISON_FIGURES", "RunDirError", "Run", "load_run", "load_runs",
    "write_run_figures", "write_comparison_figures", "format_position0_prediction",
    "position0_predictions", "dashboard_markdown", "k_series", "mixed_runs_warning", "run_identity",
    "provenance", "run_data", "run_mode", "md_row", "read_metrics", "read_yaml",
]

RUN_FIGURES = ("acceptance_conditional.png", "position0_buckets.png", "acceptance_by_category.png")
COMPARISON_FIGURES = ("per_position_acceptance.png", "position0_buckets.png", "throughput_vs_k.png",
                      "acceptance_by_category.png")


def _figure(width: float, height: float, ncols: int = 1):
    from matplotlib.figure import Figure  # Agg canvas, no pyplot global state

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path, buf.getvalue())


def conditional_intervals(pp: dict) -> tuple[list[float | None], list[float | None]]:
    """95% Wilson intervals (mtpx.metrics.analytics.wilson_interval) of the conditional
    per-position rates of analytics' per_position (accepted / reached): (lows, highs), None where
    no round reached the position."""
    cis = [wilson_interval(a, n) for a, n in zip(pp["accepted"], pp["reached"])]
    return [None if c is None else c[0] for c in cis], [None if c is None else c[1] for c in cis]


def _pct(values: Sequence[float | None]) -> list[float]:
    """Fractions as percentages; None as NaN (a gap in lines, no bar)."""
    return [float("nan") if v is None else v * 100 for v in values]


def _has(values: Sequence[float | None] | None) -> bool:
    return bool(values) and any(v is not None for v in values)



BUCKET_COLORS = {"first": "#999999", "rejection": "#d62728", "all": "#2ca02c"}
BUCKET_LEGEND = (("first", "first round (no previous round)"),
                 ("rejection", "previous round ended in a rejection (0 .. k-1 accepted)"),
                 ("all", "previous round accepted every draft"))


def _bucket_patches() -> list:
    from matplotlib.patches import Patch
    return [Patch(color=BUCKET_COLORS[key], label=text) for key, text in BUCKET_LEGEND]


def _draw_buckets(ax, buckets: dict, title: str, colours_legend: bool = True) -> None:
    """The position-0 bars on `ax`. colours_legend: the colours and the dashed line explained in a
    legend below the axes (one run's figure); else only the dashed line, inside (the comparison
    figure explains the colours once for all its panels)."""
    rows = bucket_rows(buckets)
    labels = [r[0] for r in rows]
    colors = ([BUCKET_COLORS["first"]] + [BUCKET_COLORS["rejection"]] * (len(rows) - 2)
              + [BUCKET_COLORS["all"]])
    bars = ax.bar(range(len(rows)), _pct([r[2] for r in rows]), color=colors)
    for bar, (_, count, rate) in zip(bars, rows):
        y = 0 if rate is None else rate * 100
        ax.annotate(f"n={count}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom",
                    fontsize=7, xytext=(0, 2), textcoords="offset points")
    handles = _bucket_patches() if colours_legend else []
    total = buckets["total"]["rate"]
    if total is not None:
        handles.append(ax.axhline(total * 100, color="black", lw=0.8, ls="--",
                                  label=f"every round after the first: {total * 100:.1f}%"))
    if colours_legend:
        ax.legend(handles=handles, fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2,
                  frameon=False)   # below the axes: explains the colours, hides no bar
    elif handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left")   # above the 100% line (ylim 125)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_xlabel("previous round: drafts accepted")
    ax.set_ylabel("position-0 acceptance (%)")
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def write_run_figures(metrics: dict, out_dir: str | os.PathLike) -> list[Path]:
    """Write one run's acceptance figures (module doc, `RUN_FIGURES`) into `out_dir` as PNGs.

    Args:
        metrics: a metrics dict with ``analytics`` (mtpx.metrics.analytics.analytics); without
            it (a run without speculation, an older metrics.json) nothing is written.
        out_dir: destination folder (created if needed).

    Returns:
        The paths written, in `RUN_FIGURES` order; figures without data are skipped.
    """
    out, written = Path(out_dir), []
    identity = run_identity(metrics)

    def save(fig, name: str) -> None:
        if identity:
            fig.suptitle(identity, fontsize=8)
        written.append(_save(fig, out / name))

    a = metrics.get("analytics") or {}
    pp = a.get("per_position") or {}
    if pp.get("num_rounds") and _has(pp.get("unconditional")):
        k = len(pp["unconditional"])
        fig, (ax,) = _figure(max(6.0, 0.8 * k + 2.5), 4.0)    # 6 inches: the title's identity line fits
        x = list(range(k))
        ax.bar([i - 0.2 for i in x], _pct(pp["unconditional"]), width=0.4,
               label="unconditional (/ all rounds)")
        lo, hi = conditional_intervals(pp)
        bars = ax.bar([i + 0.2 for i in x], _pct(pp["conditional"]), width=0.4,
                      label="conditional (/ rounds reaching the position), 95% Wilson interval")
        rates = _pct(pp["conditional"])
        nan = float("nan")   # no interval where no round reached the position; rounding never gives one < 0
        below = [nan if r != r or v != v else max(0.0, r - v) for r, v in zip(rates, _pct(lo))]
        above = [nan if r != r or v != v else max(0.0, v - r) for r, v in zip(rates, _pct(hi))]
        ax.errorbar([i + 0.2 for i in x], rates, yerr=[below, above], fmt="none", ecolor="black",
                    elinewidth=0.8, capsize=2)
        for bar, reached, top in zip(bars, pp["reached"], hi):
            ax.annotate(f"n={reached}", (bar.get_x() + bar.get_width() / 2, 0 if top is None else top * 100),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(x)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance (%)")
        ax.set_ylim(0, 110)
        ax.set_title(f"Per-position acceptance ({pp['num_rounds']} rounds)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        fig.legend(fontsize=7, loc="outside lower center", ncols=1)   # below the axes: hides no bar
        save(fig, RUN_FIGURES[0])
    buckets = a.get("position0_buckets")
    if buckets_have_data(buckets):
        fig, (ax,) = _figure(max(6.0, 0.6 * len(buckets["rows"]) + 3.0), 4.0)
        _draw_buckets(ax, buckets, "Position-0 acceptance by the previous round")
        save(fig, RUN_FIGURES[1])
    cats = categories_with_data(metrics)
    if len(cats) > 1:
        fig, (ax0, ax1) = _figure(10.0, 3.8, ncols=2)
        _draw_category_bars(ax0, {"": cats})
        drafted = {c: v for c, v in cats.items() if v.get("num_drafts")}
        for c, v in drafted.items():
            ax1.plot(range(len(v["per_position_acceptance"])), _pct(v["per_position_acceptance"]),
                     "o-", label=f"{c} (n={v['num_requests']})")
        ax1.set_xticks(range(max((len(v["per_position_acceptance"]) for v in drafted.values()), default=0)))
        ax1.set_xlabel("draft position")
        ax1.set_ylabel("acceptance (%)")
        ax1.set_ylim(0, 105)
        ax1.set_title("Per-position acceptance by category", fontsize=10)
        ax1.grid(alpha=0.3)
        ax1.legend(fontsize=7)
        save(fig, RUN_FIGURES[2])
    # automatic k (mtpx/metrics/cost_model_figure.py)
    written += write_auto_k_figures(metrics, out, identity)
    written += write_tree_figure(metrics, out, identity)      # tree drafting (mtpx/metrics/tree_metrics.py)
    return written



_K_KEYS = ("spec.num_speculative_tokens", "+spec.num_speculative_tokens")


def k_series(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The spec runs of throughput_vs_k.png as series (lines over k): runs of one method and
    verification whose settings other than k agree (their data set, mode and command-line
    overrides), labelled by the method (and what sets a series apart). A series never holds two
    runs of the same k: such runs (a repeat, another machine) become points of their own,
    labelled by run name, instead of one line zigzagging between them."""
    def setting(r: Run) -> tuple:
        spec = (r.config or {}).get("spec") or {}
        others = tuple(sorted(o for o in (r.overrides or []) if not o.lstrip("+~").startswith(_K_KEYS[0])
                              and not o.startswith("hydra.")))
        return (r.method or "spec", spec.get("verify") == "block", run_data(r), run_mode(r), others)

    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(setting(r), []).append(r)
    methods = [key[0] + (" block" if key[1] else "") for key in groups]
    out: dict[str, list[Run]] = {}
    for (key, rs), method in zip(groups.items(), methods):
        label = method
        if methods.count(method) > 1:          # the same method in several settings: say which
            label += f" ({', '.join(str(x) for x in (key[2], key[3], *key[4]) if x)})"
        if len({r.k for r in rs}) == len(rs):
            out[label] = rs
        else:
            out.update({r.name: [r] for r in rs})
    return out


def _draw_category_bars(ax, cats_by_run: dict[str, dict[str, dict]]) -> None:
    """Grouped bars: x = categories (first-seen order), one bar per run; n requests annotated."""
    categories = list(dict.fromkeys(c for cats in cats_by_run.values() for c in cats))
    width = 0.8 / len(cats_by_run)
    for j, (name, cats) in enumerate(cats_by_run.items()):
        xs = [i + (j - (len(cats_by_run) - 1) / 2) * width for i in range(len(categories))]
        vals = [cats.get(c, {}).get("acceptance_rate") for c in categories]
        bars = ax.bar(xs, _pct(vals), width=width, label=name or None)
        for bar, c, v in zip(bars, categories, vals):
            if c not in cats:
                continue
            failed = cats[c].get("num_failed") or 0
            text = (f"n={cats[c]['num_requests']}" + (f", {failed} failed" if failed else "")
                    if v is not None else f"no drafts ({failed} of {cats[c]['num_requests']} failed)")
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, 0 if v is None else v * 100),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points",
                        rotation=0 if v is not None else 90)
    many = len(categories) > 4           # MT-Bench's 8 names overlap when set flat
    ax.set_xticks(range(len(categories)), categories, rotation=30 if many else 0,
                  ha="right" if many else "center")
    ax.set_ylabel("acceptance rate (%)")
    ax.set_ylim(0, 110)
    ax.set_title("Acceptance rate by category", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if any(cats_by_run):
        ax.legend(fontsize=7)


def write_comparison_figures(runs: Sequence[Run], out_dir: str | os.PathLike) -> list[Path]:
    """Write the figures comparing `runs` (module doc, `COMPARISON_FIGURES`) into `out_dir`.

    Returns the paths written; a figure without data (no spec run, no analytics, no throughput,
    a single category) is skipped.
    """
    out, written = Path(out_dir), []
    spec = [r for r in runs if r.is_spec]
    # the runs compared, and when and with which commit the figure was drawn (each run's own date
    # and commit are in its figures and in the dashboard's table)
    heading = f"runs: {', '.join(r.name for r in runs)}{provenance(utc_now(), source_commit())}"

    def save(fig, name: str) -> Path:
        fig.suptitle(heading, fontsize=8)
        return _save(fig, out / name)

    if any(_has(r.metrics.get("per_position_acceptance")) for r in spec):
        fig, (ax0, ax1) = _figure(11.0, 4.0, ncols=2)
        kmax = max(r.k for r in spec)
        for r in spec:
            ax0.plot(range(r.k), _pct(r.metrics.get("per_position_acceptance") or []), "o-", label=r.name)
            cond = ((r.analytics or {}).get("per_position") or {}).get("conditional")
            if _has(cond):
                ax1.plot(range(len(cond)), _pct(cond), "o-", label=r.name)
        for ax, title in ((ax0, "unconditional (/ all rounds)"), (ax1, "conditional (/ rounds reaching it)")):
            ax.set_xticks(range(kmax))
            ax.set_xlabel("draft position")
            ax.set_ylabel("acceptance (%)")
            ax.set_ylim(0, 105)
            ax.set_title(f"Per-position acceptance, {title}", fontsize=10)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7, loc="lower left")
        written.append(save(fig, COMPARISON_FIGURES[0]))
    with_buckets = [r for r in spec if buckets_have_data((r.analytics or {}).get("position0_buckets"))]
    if with_buckets:
        fig, axes = _figure(max(9.0, sum(0.55 * r.k + 2.5 for r in with_buckets)), 4.0,
                            ncols=len(with_buckets))
        for ax, r in zip(axes, with_buckets):
            _draw_buckets(ax, r.analytics["position0_buckets"], r.name, colours_legend=False)
        fig.legend(handles=_bucket_patches(), fontsize=7, loc="outside lower center", ncols=3, frameon=False)
        written.append(save(fig, COMPARISON_FIGURES[1]))
    if any(r.metrics.get("output_throughput") is not None for r in runs):
        fig, (ax0, ax1) = _figure(10.0, 3.8, ncols=2)
        series = k_series(spec)
        for ax, key, label in ((ax0, "output_throughput", "output throughput (tok/s)"),
                               (ax1, "median_tpot_ms", "median TPOT (ms)")):
            for g, rs in series.items():
                pts = sorted((r.k, r.metrics[key]) for r in rs if r.metrics.get(key) is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if len(pts) > 1 else "o", label=g)
            for i, r in enumerate(x for x in runs if not x.is_spec and x.metrics.get(key) is not None):
                ax.axhline(r.metrics[key], color="gray", ls="--", lw=1, label=r.name if i == 0 else None)
            ax.set_xlabel("num_speculative_tokens")
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{label[0].upper()}{label[1:]} vs k", fontsize=10)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        ks = sorted({r.k for r in spec})
        if ks:
            for ax in (ax0, ax1):
                ax.set_xticks(ks)
        written.append(save(fig, COMPARISON_FIGURES[2]))
    cats = {r.name: categories_with_data(r.metrics) for r in spec}
    cats = {n: c for n, c in cats.items() if c}
    if len({c for v in cats.values() for c in v}) > 1:
        fig, (ax,) = _figure(max(5.0, 1.2 * len({c for v in cats.values() for c in v}) * len(cats) + 2), 3.8)
        _draw_category_bars(ax, cats)
        written.append(save(fig, COMPARISON_FIGURES[3]))
    return written
