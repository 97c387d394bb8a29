"""Run logging to Weights & Biases (offline by default) and the per-position acceptance plot.

``RunLogger`` is built from the ``logger`` config section::

    logger:
      name: wandb        # "wandb" | "none" (every method is then a no-op)
      project: mtpx
      mode: offline      # "offline" (default, never touches the network) | "online"
      dir: null          # where wandb writes its run folder; default: the run directory

Offline runs land in ``<dir>/wandb/offline-run-*`` and can be uploaded later with
``wandb sync``. wandb is configured through ``wandb.init`` arguments and ``wandb.Settings``
(silent, no console capture, no system-stats sampling, no git or code capture), not env vars.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mtpx.io import atomic_write_bytes, check_writable_dir
from mtpx.metrics.tree_metrics import tree_wandb

__all__ = ["RunLogger", "plot_per_position_acceptance"]

_LOGGER_NAMES = ("wandb", "none")
_MODES = ("offline", "online")


class RunLogger:
    """Logs metrics of one run to W&B, or nowhere when ``logger.name`` is "none".

    Args:
        cfg: the ``logger`` config section (an OmegaConf ``DictConfig`` or a plain mapping) with
            ``name``, and optionally ``project`` (default "mtpx"), ``mode`` (default "offline")
            and ``dir``. None means ``name: none``.
        run_dir: the run directory; wandb writes there when ``cfg.dir`` is unset.
        run_name: display name of the W&B run (default: wandb picks one).
        config: the run config to store with the W&B run (a dict, or a ``DictConfig`` that is
            resolved to one).
        group: W&B group (the jobs of one Hydra multirun share one).
        run_id: resume the W&B run with this id when it exists (a resumed training run), else
            start one under it.

    Raises:
        ValueError: unknown ``name`` or ``mode``, or ``name: wandb`` with neither ``dir`` nor
            ``run_dir`` given.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any] | None,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        group: str | None = None,
        run_id: str | None = None,
    ) -> None:
        cfg = cfg or {}
        name = cfg.get("name", "none")
        if name not in _LOGGER_NAMES:
            raise ValueError(
                f"unknown logger '{name}': choose one of {', '.join(_LOGGER_NAMES)} (logger=NAME)"
            )
        self.run = None
        if name == "none":
            return
        mode = cfg.get("mode") or "offline"
        if mode not in _MODES:
            raise ValueError(
                f"unknown wandb mode '{mode}': choose one of {', '.join(_MODES)} (logger.mode=MODE)"
            )
        directory = cfg.get("dir") or run_dir
        if directory is None:
            raise ValueError("wandb needs a directory: set logger.dir=PATH or pass the run directory")
        check_writable_dir(directory, "logger.dir" if cfg.get("dir") else "hydra.run.dir")

        import wandb  # imported here so that logger=none never pays for it

        if isinstance(config, DictConfig):
            config = OmegaConf.to_container(config, resolve=True)

        settings = wandb.Settings(
            silent=True,
            console="off",
            x_disable_stats=True,
            disable_git=True,
            save_code=False,
            disable_job_creation=True,
        )
        self.run = wandb.init(
            project=cfg.get("project") or "mtpx",
            dir=str(directory),
            mode=mode,
            name=run_name,
            config=config,
            group=group,
            id=run_id,
            resume="allow" if run_id else None,
            settings=settings,
            reinit="create_new",
        )

    @property
    def enabled(self) -> bool:
        """True while a W&B run is open."""
        return self.run is not None

    def log(self, data: dict[str, Any], step: int | None = None) -> None:
        """Log a dict of values (scalars, ``wandb`` media) at ``step`` (default: wandb's next step)."""
        if self.run is not None:
            self.run.log(data, step=step)

    def update_config(self, values: Mapping[str, Any]) -> None:
        """Replace or add run-config entries once they are known (the loaded model's architecture,
        the thread count): W&B's run.config.update with allow_val_change."""
        if self.run is not None:
            self.run.config.update(dict(values), allow_val_change=True)

    @property
    def run_id(self) -> str | None:
        return None if self.run is None else self.run.id

    def log_images(self, paths: list[Path]) -> None:
        """Log PNG files as W&B images under their file names (missing files are skipped)."""
        if self.run is None:
            return
        import wandb
        images = {f"figures/{p.stem}": wandb.Image(str(p)) for p in paths if Path(p).is_file()}
        if images:
            self.run.log(images)

    def log_metrics_summary(self, metrics: dict[str, Any]) -> None:
        """Log a metrics dict from ``compute_metrics`` (plus caller keys) as the run's summary.

        Numeric scalars go to the run summary and are logged once; ``per_position_acceptance``
        is logged as scalars ``per_position_acceptance/pos_{i}`` and as a W&B bar chart
        (``wandb.plot.bar`` over a ``wandb.Table`` with columns position, acceptance). None
        values are skipped. ``analytics`` (mtpx.metrics.analytics) is logged as tables
        (`_analytics_tables`) and as the charts of mtpx.metrics.dashboard's run figures
        (`_analytics_charts`).
        """
        if self.run is None:
            return
        import wandb

        scalars = {
            k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        positions = metrics.get("per_position_acceptance") or []
        for i, value in enumerate(positions):
            if value is not None:
                scalars[f"per_position_acceptance/pos_{i}"] = value
        scalars.update(structured_scalars(metrics.get("structured_outputs")))
        data: dict[str, Any] = dict(scalars)
        rows = [[i, v] for i, v in enumerate(positions) if v is not None]
        if rows:
            table = wandb.Table(columns=["position", "acceptance"], data=rows)
            data["per_position_acceptance_chart"] = wandb.plot.bar(
                table, "position", "acceptance", title="Per-position acceptance"
            )
        tables = self._analytics_tables(metrics.get("analytics"))
        data.update(tables)
        data.update(self._analytics_charts(metrics.get("analytics"), tables))
        tree = tree_wandb(metrics)                         # tree drafting (mtpx/metrics/tree_metrics.py)
        scalars.update({k: v for k, v in tree.items() if isinstance(v, (int, float))})
        data.update(tree)
        self.run.log(data)
        self.run.summary.update(scalars)

    @staticmethod
    def _analytics_tables(a: dict | None) -> dict[str, Any]:
        """metrics["analytics"] (mtpx.metrics.analytics) as W&B tables: per_position
        (unconditional, conditional), position0_buckets (count, rate per previous-round bucket)
        and by_category."""
        if not a:
            return {}
        import wandb

        pp = a["per_position"]
        out = {"analytics/per_position": wandb.Table(
            columns=["position", "unconditional", "conditional", "reached", "accepted"],
            data=[[i, u, c, r, x] for i, (u, c, r, x) in enumerate(
                zip(pp["unconditional"], pp["conditional"], pp["reached"], pp["accepted"]))])}
        b = a["position0_buckets"]
        rows = [[str(r["prev_accepted"]), r["count"], r["rate"]] for r in b["rows"]]
        rows += [["first round", b["first_round"]["count"], b["first_round"]["rate"]],
                 ["total", b["total"]["count"], b["total"]["rate"]]]    # row "all": every draft accepted
        out["analytics/position0_buckets"] = wandb.Table(columns=["prev_accepted", "count", "rate"],
                                                         data=rows)
        out["analytics/by_category"] = wandb.Table(
            columns=["category", "num_requests", "acceptance_rate", "acceptance_length"],
            data=[[c, v["num_requests"], v["acceptance_rate"], v["acceptance_length"]]
                  for c, v in a["by_category"].items()])
        return out

    @staticmethod
    def _analytics_charts(a: dict | None, tables: dict[str, Any]) -> dict[str, Any]:
        """The run figures of mtpx.metrics.dashboard as W&B charts, over the analytics tables
        (`tables`, from `_analytics_tables`) where a chart reads one table:

        - ``analytics/per_position_chart``: ``wandb.plot.line_series`` of the unconditional and
          conditional per-position acceptance (undefined rates left out);
        - ``analytics/position0_chart``: ``wandb.plot.bar`` of the position-0 rate per
          previous-round bucket (``analytics/position0_buckets``, counts in that table), when any
          round was bucketed;
        - ``analytics/by_category_chart``: ``wandb.plot.bar`` of the acceptance rate per category
          (``analytics/by_category``), when there is more than one category.
        """
        if not a:
            return {}
        import wandb

        out: dict[str, Any] = {}
        pp = a["per_position"]
        series = {name: [(i, v) for i, v in enumerate(pp[name]) if v is not None]
                  for name in ("unconditional", "conditional")}
        if all(series.values()):
            out["analytics/per_position_chart"] = wandb.plot.line_series(
                xs=[[i for i, _ in s] for s in series.values()],
                ys=[[v for _, v in s] for s in series.values()], keys=list(series),
                title="Per-position acceptance: unconditional vs conditional", xname="draft position")
        b = a["position0_buckets"]
        if b["total"]["count"] or b["first_round"]["count"]:
            out["analytics/position0_chart"] = wandb.plot.bar(
                tables["analytics/position0_buckets"], "prev_accepted", "rate",
                title="Position-0 acceptance by the previous round's accepted drafts")
        if len(a["by_category"]) > 1:
            out["analytics/by_category_chart"] = wandb.plot.bar(
                tables["analytics/by_category"], "category", "acceptance_rate",
                title="Acceptance rate by category")
        return out

    def finish(self) -> None:
        """Close the W&B run (flushes the offline files); safe to call twice."""
        if self.run is not None:
            self.run.finish()
            self.run = None


def plot_per_position_acceptance(
    metrics_by_run: dict[str, dict], path: str | os.PathLike[str], subtitle: str | None = None
) -> Path:
    """Write a PNG bar chart of per-position acceptance (%), grouped bars when several runs.

    Args:
        metrics_by_run: run name -> metrics dict with ``per_position_acceptance`` (fractions;
            None entries and missing positions are drawn as gaps).
        path: destination PNG; written atomically.
        subtitle: the run's identity above the chart (mtpx.metrics.dashboard.run_identity).

    Returns:
        The destination as a ``Path``.

    Raises:
        ValueError: ``metrics_by_run`` is empty or no run has any per-position value.
    """
    from matplotlib.figure import Figure  # Agg canvas, no pyplot global state

    series = {name: m.get("per_position_acceptance") or [] for name, m in metrics_by_run.items()}
    num_pos = max((len(v) for v in series.values()), default=0)
    if num_pos == 0 or all(x is None for v in series.values() for x in v):
        raise ValueError(
            "nothing to plot: no run has per_position_acceptance values "
            "(runs without speculative decoding have none; pass spec runs only)"
        )
    fig = Figure(figsize=(max(4.0, 0.9 * num_pos + 2.0), 3.6), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for j, (name, values) in enumerate(series.items()):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(values)) if values[i] is not None]
        ys = [v * 100 for v in values if v is not None]
        ax.bar(xs, ys, width=width, label=name)
    ax.set_xticks(range(num_pos))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance (%)")
    ax.set_ylim(0, 100)
    rounds = [m.get("num_drafts") for m in metrics_by_run.values()]
    ax.set_title("Per-position acceptance"
                 + (f" ({rounds[0]} rounds)" if len(rounds) == 1 and rounds[0] else ""))
    if subtitle:
        fig.suptitle(subtitle, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return atomic_write_bytes(path, buf.getvalue())


def structured_scalars(so: dict | None) -> dict[str, float]:
    """metrics["structured_outputs"] as W&B scalars: structured_outputs/{constrained,
    unconstrained}/acceptance_length and .../per_position_acceptance/pos_{i}, and the masks' ms
    per step."""
    if not so:
        return {}
    out = {f"structured_outputs/{k}": so[k] for k in ("mask_ms_per_step", "draft_mask_ms_per_step")}
    for label, v in so["by_constraint"].items():
        if v.get("acceptance_length") is not None:
            out[f"structured_outputs/{label}/acceptance_length"] = v["acceptance_length"]
        for i, x in enumerate(v.get("per_position_acceptance") or []):
            if x is not None:
                out[f"structured_outputs/{label}/per_position_acceptance/pos_{i}"] = x
    return out
