"""Tree drafting's metrics (`spec.tree`, docs/trees.md) in the report, the sweep table, W&B and a
figure, from ``metrics["tree"]`` (mtpx/engine/tree_step.py, TreeStats.summary):

- report rows (`tree_report_rows`): draft nodes verified per round and per step, the accepted
  path length (accepted nodes per round), per-depth acceptance, and per depth the share of
  accepted paths that took the draft's rank-0 / rank-1 / ... child;
- sweep columns (`TREE_COLUMNS`, mtpx.metrics.sweep): nodes per round, accepted path length and
  per-depth acceptance;
- W&B (`tree_wandb`): those numbers as scalars ``tree/...`` and the rank counts as a table;
- ``tree_acceptance.png`` (`write_tree_figure`): a depth x rank heat map over the tree's depths and
  widths, cell (d, r) = the share of rounds whose accepted path went through a rank-r child at
  depth d (each row sums to that depth's acceptance), annotated with the share and the count.

Rates are fractions in metrics.json and percentages in tables and figures.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

from mtpx.io import atomic_write_bytes

__all__ = ["TREE_FIGURE", "TREE_COLUMNS", "tree_report_rows", "tree_wandb", "write_tree_figure"]

TREE_FIGURE = "tree_acceptance.png"


def _tree(m: dict) -> dict | None:
    t = m.get("tree")
    return t if isinstance(t, dict) and t.get("accepted_rank_per_depth") is not None else None


def _rounds(t: dict) -> int:
    """Rounds (requests that verified a tree), from the summary's counts."""
    return t.get("rounds") or 0


def accepted_path_length(t: dict) -> float:
    """Accepted nodes per round: the per-depth acceptances summed (acceptance length - 1)."""
    return t.get("accepted_path_length", sum(t.get("per_depth_acceptance") or []))


def _per_depth(t: dict) -> str:
    return " / ".join(f"{v * 100:.1f}" for v in t.get("per_depth_acceptance") or []) or "-"


def _rank_shares(t: dict) -> str:
    """Per depth, the share (%) of accepted nodes at each sibling rank: "d1: 81/15/4 · d2: 90/10"."""
    parts = []
    for d, row in enumerate(t["accepted_rank_per_depth"]):
        total = sum(row)
        if total:
            parts.append(f"d{d + 1}: " + "/".join(f"{100 * c / total:.0f}" for c in row))
    return " · ".join(parts) or "-"


def tree_report_rows(m: dict) -> list[tuple[str, str]]:
    """The report's tree rows (module doc) for metrics m; [] without a tree."""
    t = _tree(m)
    if t is None:
        return []
    return [("Tree: draft nodes verified per round", f"{t['nodes_per_round']:.2f}"),
            ("Tree: draft nodes verified per step", f"{t['nodes_per_step']:.2f}"),
            ("Tree: accepted path length", f"{accepted_path_length(t):.2f}"),
            ("Tree: per-depth acceptance (%)", _per_depth(t)),
            ("Tree: accepted rank per depth (% of accepted)", _rank_shares(t))]


TREE_COLUMNS = (
    ("Tree nodes / round", lambda m: None if _tree(m) is None else f"{_tree(m)['nodes_per_round']:.2f}"),
    ("Accepted path length", lambda m: None if _tree(m) is None else f"{accepted_path_length(_tree(m)):.2f}"),
    ("Tree per-depth acceptance (%)", lambda m: None if _tree(m) is None else _per_depth(_tree(m))),
)


def tree_wandb(m: dict) -> dict:
    """W&B scalars tree/nodes_per_round, tree/nodes_per_step, tree/accepted_path_length,
    tree/per_depth_acceptance/depth_{d} (d from 1), and the table tree/accepted_rank (depth, rank,
    count, share of rounds); {} without a tree."""
    t = _tree(m)
    if t is None:
        return {}
    import wandb

    out = {"tree/nodes_per_round": t["nodes_per_round"], "tree/nodes_per_step": t["nodes_per_step"],
           "tree/accepted_path_length": accepted_path_length(t)}
    for d, v in enumerate(t.get("per_depth_acceptance") or []):
        out[f"tree/per_depth_acceptance/depth_{d + 1}"] = v
    rounds = max(_rounds(t), 1)
    out["tree/accepted_rank"] = wandb.Table(
        columns=["depth", "rank", "count", "share_of_rounds"],
        data=[[d + 1, r, c, c / rounds] for d, row in enumerate(t["accepted_rank_per_depth"])
              for r, c in enumerate(row)])
    return out


def write_tree_figure(metrics: dict, out_dir: str | os.PathLike, identity: str = "") -> list[Path]:
    """tree_acceptance.png (module doc) in out_dir -> [its path], or [] without a tree or rounds."""
    t = _tree(metrics)
    counts = [] if t is None else t["accepted_rank_per_depth"]
    if not counts or not _rounds(t):
        return []
    from matplotlib.figure import Figure

    rounds, paths = _rounds(t), t.get("paths") or []
    depth = max([len(counts)] + [len(p) for p in paths])             # depths never reached: zero rows
    ranks = max([len(row) for row in counts] + [p[-1] + 1 for p in paths])
    counts = counts + [[]] * (depth - len(counts))
    grid = [[100 * (row[r] if r < len(row) else 0) / rounds for r in range(ranks)] for row in counts]
    fig = Figure(figsize=(max(5.0, 1.2 * ranks + 3.0), max(3.0, 0.45 * depth + 1.8)), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    for d, row in enumerate(counts):
        for r in range(ranks):
            c = row[r] if r < len(row) else 0
            ax.text(r, d, f"{grid[d][r]:.1f}%\nn={c}", ha="center", va="center", fontsize=7,
                    color="white" if grid[d][r] < 50 else "black")
    ax.set_xticks(range(ranks), [str(r) for r in range(ranks)])
    ax.set_yticks(range(depth), [str(d + 1) for d in range(depth)])
    ax.set_xlabel("sibling rank of the accepted node (0: the draft's first choice)")
    ax.set_ylabel("depth")
    ax.set_title(f"Tree acceptance by depth and rank (% of {rounds} rounds)", fontsize=10)
    fig.colorbar(image, ax=ax, label="% of rounds")
    if identity:
        fig.suptitle(identity, fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return [atomic_write_bytes(Path(out_dir) / TREE_FIGURE, buf.getvalue())]
