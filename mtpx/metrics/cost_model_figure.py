"""Figures of automatic k (`num_speculative_tokens=auto`) for a run's folder, from
``metrics["auto_k"]`` (mtpx/auto_k/policy.py, AutoDraftLength.summary); `write_auto_k_figures` is called by
mtpx.metrics.dashboard.write_run_figures:

- ``auto_k_histograms.png``: the k per decode step, the draft depth per request and (per-request k)
  the drafts each request verified per step (% of steps, requests, request-steps);
- ``cost_model.png``: "cost model: predicted vs measured speed-up per batch size": per batch
  bucket, the speed-up over plain decoding (k = 0) the policy predicted for its steps next to the
  one measured (auto_k.cost_model, mtpx/auto_k/cost_model_log.py), each pair annotated with its
  step count and where the measured plain step comes from;
- ``acceptance_by_age.png``: automatic k's conditional acceptance per draft position, one line
  per age of the generation (output tokens; auto_k.acceptance_by_age, mtpx/auto_k/acceptance.py),
  drawn where a bucket has at least one (discounted) verified draft.

A figure without data (a fixed k, no pure decode step compared) is not written. matplotlib's
object API (``Figure``, no pyplot state); files written atomically.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

from mtpx.io import atomic_write_bytes

__all__ = ["AUTO_K_FIGURES", "write_auto_k_figures"]

AUTO_K_FIGURES = ("auto_k_histograms.png", "cost_model.png", "acceptance_by_age.png")


def _percent(hist: dict) -> tuple[list[int], list[float]]:
    """{str(k): count} -> (sorted ks, % of the total)."""
    total = sum(hist.values())
    keys = sorted(int(k) for k in hist)
    return keys, [100 * hist[str(k)] / total for k in keys]


def write_auto_k_figures(metrics: dict, out_dir: str | os.PathLike, identity: str = "") -> list[Path]:
    """Write the automatic-k figures (module doc) of one run's metrics into out_dir.

    Args:
        metrics: a metrics dict; without ``auto_k`` nothing is written.
        out_dir: destination folder (created if needed).
        identity: a line above each figure (mtpx.metrics.dashboard.run_identity), "" for none.

    Returns:
        The paths written, in `AUTO_K_FIGURES` order; figures without data are skipped.
    """
    from matplotlib.figure import Figure  # Agg canvas, no pyplot global state

    auto_k, out, written = metrics.get("auto_k") or {}, Path(out_dir), []

    def save(fig, name: str) -> None:
        if identity:
            fig.suptitle(identity, fontsize=8)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        written.append(atomic_write_bytes(out / name, buf.getvalue()))

    steps, depths = auto_k.get("k_histogram") or {}, auto_k.get("depth_histogram") or {}
    verified = auto_k.get("verified_histogram") or {}
    series = [(h, label) for h, label in (
        (steps, f"k per decode step ({sum(steps.values())} steps)"),
        (depths, f"draft depth per request ({sum(depths.values())} requests)"),
        (verified, f"drafts verified per request and step ({sum(verified.values())})")) if h]
    if series:
        fig = Figure(figsize=(7.0, 3.8), layout="constrained")
        ax = fig.subplots()
        width = 0.8 / len(series)
        for n, (hist, label) in enumerate(series):
            ks, pct = _percent(hist)
            offset = (n - (len(series) - 1) / 2) * width
            ax.bar([k + offset for k in ks], pct, width=width, label=label)
        ax.set_xticks(range(max(int(k) for h, _ in series for k in h) + 1))
        ax.set_xlabel("drafts (k, depth)")
        ax.set_ylabel("% of steps / requests")
        ax.set_title("Automatic k: drafts per step, per request and draft depth", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, AUTO_K_FIGURES[0])
    rows = {b: r for b, r in (auto_k.get("cost_model") or {}).items() if r.get("steps")}
    if rows:
        fig = Figure(figsize=(max(6.0, 1.1 * len(rows) + 3.0), 4.0), layout="constrained")
        ax = fig.subplots()
        x = list(range(len(rows)))
        predicted = [r["predicted_speedup"] for r in rows.values()]
        measured = [r["measured_speedup"] for r in rows.values()]
        ax.bar([i - 0.2 for i in x], predicted, width=0.4, label="predicted (policy's cost model)")
        bars = ax.bar([i + 0.2 for i in x], measured, width=0.4, label="measured (step wall time)")
        for bar, r in zip(bars, rows.values()):
            plain = "plain measured" if r["plain_step_ms_source"] == "measured" else "plain calibrated"
            ax.annotate(f"n={r['steps']}\n{plain}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=6, xytext=(0, 2), textcoords="offset points")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(x, list(rows))
        ax.set_xlabel("batch size (requests decoding)")
        ax.set_ylabel("speed-up over k = 0")
        ax.set_ylim(0, 1.25 * max(predicted + measured + [1.0]))
        ax.set_title("Cost model: predicted vs measured speed-up per batch size", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        fig.legend(fontsize=7, loc="outside lower center", ncols=2)
        save(fig, AUTO_K_FIGURES[1])
    fig = _acceptance_by_age(auto_k.get("acceptance_by_age") or [])
    if fig is not None:
        save(fig, AUTO_K_FIGURES[2])
    return written


def _acceptance_by_age(rows: list[dict]):
    """The acceptance-by-age Figure (module doc) of auto_k.acceptance_by_age; None when no bucket
    has a position with a verified draft."""
    from matplotlib.figure import Figure

    ages = [(row, [(j + 1, p) for j, (p, v) in enumerate(zip(row["conditional_acceptance"], row["verified"]))
                   if v >= 1])
            for row in rows]
    if not any(points for _, points in ages):
        return None
    fig = Figure(figsize=(6.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for row, points in ages:
        if points:
            ax.plot(*zip(*points), marker="o", label=f"output tokens {row['output_tokens']}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("conditional acceptance")
    ax.set_ylim(0, 1.02)
    ax.set_title("Automatic k: acceptance by age of the generation", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig
