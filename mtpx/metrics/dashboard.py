"""Figures and tables that explain a run's acceptance, and compare runs and sweeps.

One run (`write_run_figures`, called at the end of an eval): from ``metrics["analytics"]``
(mtpx.metrics.analytics) it writes
- ``acceptance_conditional.png``: per-position acceptance, unconditional (rounds whose i-th draft
  was accepted / all rounds, vLLM's definition) next to conditional (/ rounds that verified
  position i), the count of rounds that reached each position above its bar;
- ``position0_buckets.png``: position-0 acceptance by the previous round of the same request
  (first round, 0 .. k-1 accepted, all accepted), each bar annotated with its round count;
- ``acceptance_by_category.png``: acceptance rate and per-position acceptance per prompt category
  (only when the run has more than one category).
A figure without data (a run without speculation, or with one category) is not written.

Several runs (`load_run`, `write_comparison_figures`, `dashboard_markdown`, used by
tools/dashboard.py): per-position curves side by side, each run's position-0 buckets, output
throughput and median TPOT against num_speculative_tokens, acceptance by category, and the
position-0 prediction of every ordered pair of spec runs (`position0_predictions`).

A Hydra multirun's table is mtpx.metrics.sweep's.

Figures use matplotlib's object API (``Figure`` with the Agg canvas, no pyplot global state) and
are written atomically (mtpx.io.atomic_write_bytes). Rates are fractions in the metrics dicts and
percentages in figures and tables.
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpx.io import atomic_write_bytes, source_commit, utc_now
from mtpx.metrics.analytics import predict_position0, wilson_interval
from mtpx.metrics.report import DASH, format_comparison

__all__ = [
    "RUN_FIGURES", "COMPARISON_FIGURES", "RunDirError", "Run", "load_run", "load_runs",
    "write_run_figures", "write_comparison_figures", "format_position0_prediction",
    "position0_predictions", "dashboard_markdown",
]

RUN_FIGURES = ("acceptance_conditional.png", "position0_buckets.png", "acceptance_by_category.png")
COMPARISON_FIGURES = ("per_position_acceptance.png", "position0_buckets.png", "throughput_vs_k.png",
                      "acceptance_by_category.png")


class RunDirError(ValueError):
    """A run directory that cannot be read (no metrics.json, unreadable JSON); one-line message."""


# --------------------------------------------------------------------------------------------------
# runs


@dataclass
class Run:
    """One eval run directory.

    Attributes:
        path: the run directory.
        name: display name (`--names`, else from the spec method and k, e.g. "mtp8", "mtp1 k=3",
            "no spec"; made unique by `load_runs`).
        metrics: metrics.json.
        method: the spec method ("mtp1", "mtp8"), None without speculation.
        k: num_speculative_tokens: len(per_position_acceptance) when the run has it, else the
            config's spec.num_speculative_tokens, else 0.
        config: .hydra/config.yaml as a dict (None when absent).
        overrides: .hydra/overrides.yaml (None when absent).
    """

    path: Path
    name: str
    metrics: dict
    method: str | None
    k: int
    config: dict | None = None
    overrides: list[str] | None = None

    @property
    def analytics(self) -> dict | None:
        return self.metrics.get("analytics") or None

    @property
    def is_spec(self) -> bool:
        return self.k > 0


def read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def read_metrics(run_dir: Path) -> dict:
    file = run_dir / "metrics.json"
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory: pass run directories written by mode=eval")
    if not file.is_file():
        raise RunDirError(f"{file} not found: pass run directories written by mode=eval "
                          "(python train_or_eval.py [+spec=...]), after the run has finished")
    try:
        metrics = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RunDirError(f"{file} is not readable JSON ({err}): rerun the eval") from err
    if not isinstance(metrics, dict):
        raise RunDirError(f"{file} holds a {type(metrics).__name__}, not a metrics object: rerun the eval")
    return metrics


def _default_name(method: str | None, k: int, config: dict | None) -> str:
    if not k:
        return "no spec"
    spec = (config or {}).get("spec") or {}
    name = method or "spec"
    if not ((method == "mtp1" and k == 1) or (method == "mtp8" and k == 8)):
        name += f" k={k}"
    if spec.get("verify") == "block":
        name += " block"
    return name


def load_run(run_dir: str | os.PathLike, name: str | None = None) -> Run:
    """Read one eval run directory (metrics.json, and .hydra/config.yaml and overrides.yaml when
    present). Raises RunDirError with a one-line message when metrics.json is missing or unreadable."""
    path = Path(run_dir)
    metrics = read_metrics(path)
    config = read_yaml(path / ".hydra" / "config.yaml")
    config = config if isinstance(config, dict) else None
    overrides = read_yaml(path / ".hydra" / "overrides.yaml")
    overrides = [str(o) for o in overrides] if isinstance(overrides, list) else None
    spec = (config or {}).get("spec") or {}
    k = len(metrics.get("per_position_acceptance") or [])
    if not k and isinstance(spec.get("num_speculative_tokens"), int) and metrics.get("num_drafts"):
        k = spec["num_speculative_tokens"]
    method = spec.get("method") if k else None
    return Run(path, name or _default_name(method, k, config), metrics, method, k, config, overrides)


def load_runs(run_dirs: Sequence[str | os.PathLike], names: Sequence[str] | None = None) -> list[Run]:
    """`load_run` for each directory; default names that collide get the directory name appended.

    Raises:
        RunDirError: a directory without a readable metrics.json.
        ValueError: `names` given with a different length, or with duplicates.
    """
    if names is not None:
        if len(names) != len(run_dirs):
            raise ValueError(f"{len(names)} names for {len(run_dirs)} run directories: give one name per run")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate run names in {list(names)}: give each run its own name")
    runs = [load_run(d, None if names is None else names[i]) for i, d in enumerate(run_dirs)]
    if names is None:
        for run in runs:
            if sum(r.name == run.name for r in runs) > 1:
                run.name = f"{run.name} ({run.path.name})"
        seen: dict[str, int] = {}
        for run in runs:
            n = seen[run.name] = seen.get(run.name, 0) + 1
            if n > 1:
                run.name = f"{run.name} #{n}"
    return runs


# --------------------------------------------------------------------------------------------------
# figures


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


def _bucket_rows(buckets: dict) -> list[tuple[str, int, float | None]]:
    """(label, count, rate) for the first round, each previous-round bucket and "all"."""
    rows = [("first", buckets["first_round"]["count"], buckets["first_round"]["rate"])]
    rows += [(str(r["prev_accepted"]), r["count"], r["rate"]) for r in buckets["rows"]]
    return rows


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
    rows = _bucket_rows(buckets)
    labels = [r[0] for r in rows]
    colors = [BUCKET_COLORS["first"]] + [BUCKET_COLORS["rejection"]] * (len(rows) - 2) + [BUCKET_COLORS["all"]]
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


def _buckets_have_data(buckets: dict | None) -> bool:
    return bool(buckets) and any(count for _, count, _ in _bucket_rows(buckets))


def _categories_with_data(metrics: dict) -> dict[str, dict]:
    """Every category of the run, those whose requests all failed (no drafts) included: the bar
    chart marks them instead of leaving them out."""
    return dict(((metrics.get("analytics") or {}).get("by_category")) or {})


def run_identity(metrics: dict) -> str:
    """'MODEL · SPEC k=K · DATA · N prompts · DATE · commit C' from metrics["run"]
    (mtpx.evaluate), for figure titles; the date (UTC, to the minute) and the commit's first 9
    hex digits ("+dirty" kept) when recorded; '' for a metrics dict without "run" (an older
    metrics.json)."""
    r = metrics.get("run") or {}
    if not r:
        return ""
    spec = f"{r['spec']} k={r['num_speculative_tokens']}" if r.get("spec") else "plain decoding"
    partial = " (interrupted)" if metrics.get("partial") else ""
    return (f"{Path(str(r.get('model', ''))).name} · {spec} · {r.get('data')} · {r.get('num_prompts')} prompts"
            f"{partial}{provenance(r.get('date'), r.get('commit'))}")


def provenance(date: str | None, commit: str | None) -> str:
    """' · 2026-12-03 16:40 UTC · commit 04292ad1f' (the parts that are known), for figure titles.
    date: ISO 8601 in UTC (mtpx.io.utc_now); commit: mtpx.io.source_commit's."""
    parts = []
    if date:
        parts.append(f"{str(date)[:16].replace('T', ' ')} UTC")
    if commit:
        head, dirty = str(commit).partition("+")[::2]
        parts.append(f"commit {head[:9]}" + (f"+{dirty}" if dirty else ""))
    return "".join(f" · {p}" for p in parts)


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
        ax.errorbar([i + 0.2 for i in x], rates, yerr=[below, above], fmt="none", ecolor="black", elinewidth=0.8,
                    capsize=2)
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
    if _buckets_have_data(buckets):
        fig, (ax,) = _figure(max(6.0, 0.6 * len(buckets["rows"]) + 3.0), 4.0)
        _draw_buckets(ax, buckets, "Position-0 acceptance by the previous round")
        save(fig, RUN_FIGURES[1])
    cats = _categories_with_data(metrics)
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
    ax.set_xticks(range(len(categories)), categories, rotation=30 if many else 0, ha="right" if many else "center")
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
    with_buckets = [r for r in spec if _buckets_have_data((r.analytics or {}).get("position0_buckets"))]
    if with_buckets:
        fig, axes = _figure(max(9.0, sum(0.55 * r.k + 2.5 for r in with_buckets)), 4.0, ncols=len(with_buckets))
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
    cats = {r.name: _categories_with_data(r.metrics) for r in spec}
    cats = {n: c for n, c in cats.items() if c}
    if len({c for v in cats.values() for c in v}) > 1:
        fig, (ax,) = _figure(max(5.0, 1.2 * len({c for v in cats.values() for c in v}) * len(cats) + 2), 3.8)
        _draw_category_bars(ax, cats)
        written.append(save(fig, COMPARISON_FIGURES[3]))
    return written


# --------------------------------------------------------------------------------------------------
# position-0 predictions and the dashboard summary


def format_position0_prediction(name_a: str, buckets_a: dict, name_b: str, buckets_b: dict) -> str:
    """One line: run B's position-0 rate predicted from run A's conditional rates and B's mix
    (mtpx.metrics.analytics.predict_position0), and B's measured rate, e.g. "predicted mtp8
    position-0 from mtp1's conditional rates: 0.771 x 0.704 + 0.229 x 0.857 = 0.739; measured 0.756"."""
    p = predict_position0(buckets_a, buckets_b)
    measured = DASH if p["measured"] is None else f"{p['measured']:.3f}"
    return f"predicted {name_b} position-0 from {name_a}'s conditional rates: {p['formula']}; measured {measured}"


def position0_predictions(runs: Sequence[Run]) -> list[str]:
    """`format_position0_prediction` for every ordered pair (A, B), A != B, of runs with
    position-0 buckets, in run order."""
    have = [r for r in runs if r.is_spec and (r.analytics or {}).get("position0_buckets")]
    return [format_position0_prediction(a.name, a.analytics["position0_buckets"],
                                        b.name, b.analytics["position0_buckets"])
            for a in have for b in have if a is not b]


def md_row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "---:") -> str:
    lines = [md_row(header), "| --- |" + f" {align} |" * (len(header) - 1)]
    return "\n".join(lines + [md_row(r) for r in rows]) + "\n"


def _rate_n(rate: float | None, count: int | None) -> str:
    if rate is None:
        return DASH if not count else f"{DASH} (n={count})"
    return f"{rate * 100:.1f}% (n={count})"


def _buckets_table(runs: Sequence[Run]) -> str | None:
    have = [r for r in runs if _buckets_have_data((r.analytics or {}).get("position0_buckets"))]
    if not have:
        return None
    labels: list[str] = ["first round"]
    labels += [str(i) for i in range(max(r.k for r in have))] + ["all"]
    cells: dict[str, dict[str, str]] = {}
    for r in have:
        b = r.analytics["position0_buckets"]
        col = {"first round": _rate_n(b["first_round"]["rate"], b["first_round"]["count"])}
        col.update({str(x["prev_accepted"]): _rate_n(x["rate"], x["count"]) for x in b["rows"]})
        col["after a rejection (0 .. k-1)"] = _rate_n(b["after_rejection"]["rate"], b["after_rejection"]["count"])
        col["after round 1, all"] = _rate_n(b["total"]["rate"], b["total"]["count"])
        s = b["share_after_rejection"]
        col["share after a rejection"] = DASH if s is None else f"{s:.3f}"
        cells[r.name] = col
    labels += ["after a rejection (0 .. k-1)", "after round 1, all", "share after a rejection"]
    rows = [[("previous round accepted " + lab) if lab.isdigit() or lab == "all" else lab,
             *(cells[r.name].get(lab, DASH) for r in have)] for lab in labels]
    return _md_table(["Position 0", *(r.name for r in have)], rows)


def _category_table(runs: Sequence[Run]) -> str | None:
    cats = {r.name: ((r.analytics or {}).get("by_category") or {}) for r in runs if r.is_spec}
    cats = {n: c for n, c in cats.items() if c}
    categories = list(dict.fromkeys(c for v in cats.values() for c in v))
    if not categories:
        return None

    def cell(v: dict | None) -> str:
        if not v:
            return DASH
        rate = DASH if v.get("acceptance_rate") is None else f"{v['acceptance_rate'] * 100:.2f}%"
        length = DASH if v.get("acceptance_length") is None else f"{v['acceptance_length']:.2f}"
        return f"{rate} / {length} (n={v['num_requests']})"

    rows = [[c, *(cell(cats[n].get(c)) for n in cats)] for c in categories]
    return _md_table(["Category: acceptance rate / length", *cats], rows)


def run_data(run: Run) -> str | None:
    """The run's data set: metrics.json["run"]["data"], else .hydra/config.yaml's data.name."""
    return (run.metrics.get("run") or {}).get("data") or ((run.config or {}).get("data") or {}).get("name")


def run_mode(run: Run) -> str | None:
    return (run.metrics.get("run") or {}).get("mode") or (run.config or {}).get("mode")


def mixed_runs_warning(runs: Sequence[Run]) -> str | None:
    """A line when the runs mix data sets or modes (eval and bench clients differ in concurrency
    and prompt count), whose throughput and acceptance do not compare; None otherwise."""
    parts = []
    for what, values in (("data sets", {run_data(r) for r in runs}), ("modes", {run_mode(r) for r in runs})):
        known = sorted(v for v in values if v)
        if len(known) > 1:
            parts.append(f"{what} ({', '.join(known)})")
    if not parts:
        return None
    return f"warning: these runs mix {' and '.join(parts)}: their throughput and acceptance do not compare"


def dashboard_markdown(runs: Sequence[Run], figures: Sequence[str | os.PathLike] = (),
                       title: str = "mtpx dashboard") -> str:
    """The markdown summary of `runs`: the runs, the main comparison table
    (mtpx.metrics.report.format_comparison), position-0 buckets, the position-0 predictions,
    acceptance by category, and links to `figures` (by file name: the summary sits next to them)."""
    mixed = mixed_runs_warning(runs)
    parts = [f"# {title}\n", *([f"**{mixed}**\n"] if mixed else []),
             _md_table(["Run", "Directory", "Spec", "k", "Data", "Mode"],
                       [[r.name, str(r.path), r.method or DASH, r.k, run_data(r) or DASH, run_mode(r) or DASH]
                        for r in runs], align="---"),
             "## Metrics\n", format_comparison({r.name: r.metrics for r in runs})]
    buckets = _buckets_table(runs)
    if buckets:
        parts += ["## Position 0 by the previous round\n",
                  "Position-0 acceptance (n = rounds) by how many drafts the same request's "
                  "previous round accepted; the first round of a request has no previous round.\n",
                  buckets]
    predictions = position0_predictions(runs)
    if predictions:
        parts += ["## Position-0 predictions\n",
                  "Run B's position-0 rate from run A's rates after a rejection and after a full "
                  "acceptance, weighted by B's share of rounds after a rejection.\n",
                  "".join(f"- {p}\n" for p in predictions)]
    cats = _category_table(runs)
    if cats:
        parts += ["## Acceptance by category\n", cats]
    if figures:
        parts += ["## Figures\n", "".join(f"![{Path(f).stem}]({Path(f).name})\n\n" for f in figures).rstrip() + "\n"]
    return "\n".join(parts)
