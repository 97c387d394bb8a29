"""What a training run writes and prints about its losses: losses.csv, loss_curve.png (and its
title line), and the loss lines of the log and the progress bar (mtpx.train.loop calls them)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mtpx.io import source_commit, utc_now
from mtpx.metrics.run_dirs import provenance
from mtpx.models.config import ModelConfig



def depth_names(num_mtp: int) -> list[str]:
    """["main", "mtp1", ..., "mtpN"]."""
    return ["main"] + [f"mtp{k}" for k in range(1, num_mtp + 1)]


def write_losses_csv(history: list[dict[str, Any]], file: Path, num_mtp: int) -> None:
    """One row per history entry: step, split (train|val), lr, loss, grad_norm, main, mtp1..mtpN."""
    cols = ["step", "split", "lr", "loss", "grad_norm", *depth_names(num_mtp)]
    with file.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(history)


def plot_loss_curve(history: list[dict[str, Any]], file: Path, num_mtp: int,
                    identity: str | None = None) -> None:
    """PNG with two panels, train loss and val loss per depth: main in black, MTP depth k in a
    viridis colour from dark (depth 1) to light (depth num_mtp), one legend entry per depth;
    identity: the run's line above them (`loss_curve_identity`)."""
    # Figure + Agg canvas directly: no pyplot global state, no display needed
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    names = depth_names(num_mtp)
    cmap = colormaps["viridis"]
    for ax, split, style in ((axes[0], "train", dict(lw=0.8)), (axes[1], "val", dict(marker="o", ms=3))):
        for i, d in enumerate(names):
            color = "black" if d == "main" else cmap(0.85 * (i - 1) / max(num_mtp - 1, 1))
            pts = [(h["step"], h[d]) for h in history if h["split"] == split and d in h]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, color=color, label=d, **style)
        ax.set_xlabel("step")
        ax.set_title(f"{split} loss per depth", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cross-entropy (nats/token)")
    if identity:
        fig.suptitle(identity, fontsize=8)
    handles, labels = axes[1].get_legend_handles_labels()
    if not handles:                      # no validation yet
        handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[1].legend(handles, labels, fontsize=7, ncol=1, loc="upper right",
                       title="main = next token, mtpk = token k+1 ahead", title_fontsize=7)
    fig.savefig(file)


def loss_curve_identity(out_dir: Path, mcfg: ModelConfig, t: DictConfig, step: int) -> str:
    """loss_curve.png's title: 'OUT_DIR · L layers x H, N MTP modules (style) · data SOURCES ·
    step S of STEPS · DATE UTC · commit C'."""
    return (f"{out_dir.name} · {mcfg.num_hidden_layers} layers x {mcfg.hidden_size}, "
            f"{mcfg.num_nextn_predict_layers} MTP modules ({mcfg.mtp_style}) · data "
            f"{','.join(map(str, t.data_sources))} · step {step} of "
            f"{t.steps}{provenance(utc_now(), source_commit())}")


def format_losses(losses: dict[str, float], names: list[str]) -> str:
    """'main 3.210 mtp1 3.502 ...' (eval lines)."""
    return " ".join(f"{n} {losses[n]:.3f}" for n in names if n in losses)


def format_losses_compact(losses: dict[str, float], names: list[str]) -> str:
    """'main 3.21 mtp1-8 3.50 3.61 ...': fits a progress bar line even with 8 depths."""
    mtp = [f"{losses[n]:.2f}" for n in names[1:]]
    return f"main {losses['main']:.2f}" + (f" mtp1-{len(mtp)} " + " ".join(mtp) if mtp else "")
