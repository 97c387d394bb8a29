"""The markdown summary of several eval runs (`dashboard_markdown`, written by tools/dashboard.py as
summary.md next to the figures of mtpx.metrics.dashboard): the runs, the main comparison table,
position-0 buckets, the position-0 prediction of every ordered pair of spec runs
(`position0_predictions`), and acceptance by category. Rates are percentages in its tables.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtpx.metrics.analytics import predict_position0
from mtpx.metrics.report import DASH, format_comparison
from mtpx.metrics.run_dirs import Run, buckets_have_data, mixed_runs_warning, run_data, run_mode


def format_position0_prediction(name_a: str, buckets_a: dict, name_b: str, buckets_b: dict) -> str:
    """One line: run B's position-0 rate predicted from run A's conditional rates and B's mix
    (mtpx.metrics.analytics.predict_position0), and B's measured rate, e.g. "predicted mtp8
    position-0 from mtp1's conditional rates: 0.771 x 0.704 + 0.229 x 0.857 = 0.739; measured 0.756"."""
    p = predict_position0(buckets_a, buckets_b)
    measured = DASH if p["measured"] is None else f"{p['measured']:.3f}"
    return (f"predicted {name_b} position-0 from {name_a}'s conditional rates: {p['formula']}; "
            f"measured {measured}")


def position0_predictions(runs: Sequence[Run]) -> list[str]:
    """`format_position0_prediction` for every ordered pair (A, B), A != B, of runs with
    position-0 buckets, in run order."""
    have = [r for r in runs if r.is_spec and (r.analytics or {}).get("position0_buckets")]
    return [format_position0_prediction(a.name, a.analytics["position0_buckets"],
                                        b.name, b.analytics["position0_buckets"])
            for a in have for b in have if a is not b]


def md_row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "---:") -> str:
    lines = [md_row(header), "| --- |" + f" {align} |" * (len(header) - 1)]
    return "\n".join(lines + [md_row(r) for r in rows]) + "\n"


def _rate_n(rate: float | None, count: int | None) -> str:
    if rate is None:
        return DASH if not count else f"{DASH} (n={count})"
    return f"{rate * 100:.1f}% (n={count})"


def _buckets_table(runs: Sequence[Run]) -> str | None:
    have = [r for r in runs if buckets_have_data((r.analytics or {}).get("position0_buckets"))]
    if not have:
        return None
    labels: list[str] = ["first round"]
    labels += [str(i) for i in range(max(r.k for r in have))] + ["all"]
    cells: dict[str, dict[str, str]] = {}
    for r in have:
        b = r.analytics["position0_buckets"]
        col = {"first round": _rate_n(b["first_round"]["rate"], b["first_round"]["count"])}
        col.update({str(x["prev_accepted"]): _rate_n(x["rate"], x["count"]) for x in b["rows"]})
        col["after a rejection (0 .. k-1)"] = _rate_n(b["after_rejection"]["rate"],
                                                      b["after_rejection"]["count"])
        col["after round 1, all"] = _rate_n(b["total"]["rate"], b["total"]["count"])
        s = b["share_after_rejection"]
        col["share after a rejection"] = DASH if s is None else f"{s:.3f}"
        cells[r.name] = col
    labels += ["after a rejection (0 .. k-1)", "after round 1, all", "share after a rejection"]
    rows = [[("previous round accepted " + lab) if lab.isdigit() or lab == "all" else lab,
             *(cells[r.name].get(lab, DASH) for r in have)] for lab in labels]
    return md_table(["Position 0", *(r.name for r in have)], rows)


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
    return md_table(["Category: acceptance rate / length", *cats], rows)


def dashboard_markdown(runs: Sequence[Run], figures: Sequence[str | os.PathLike] = (),
                       title: str = "mtpx dashboard") -> str:
    """The markdown summary of `runs`: the runs, the main comparison table
    (mtpx.metrics.report.format_comparison), position-0 buckets, the position-0 predictions,
    acceptance by category, and links to `figures` (by file name: the summary sits next to them)."""
    mixed = mixed_runs_warning(runs)
    parts = [f"# {title}\n", *([f"**{mixed}**\n"] if mixed else []),
             md_table(["Run", "Directory", "Spec", "k", "Data", "Mode"],
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
        parts += ["## Figures\n",
                  "".join(f"![{Path(f).stem}]({Path(f).name})\n\n" for f in figures).rstrip() + "\n"]
    return "\n".join(parts)
