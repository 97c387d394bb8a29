"""Compare eval runs in figures:
`python tools/dashboard.py RUN_DIR [RUN_DIR ...] [--out DIR] [--names a b ...]`.

Reads each run directory's metrics.json (and .hydra/config.yaml for the spec method) and writes
into --out (default outputs/dashboard):
- per_position_acceptance.png: per-position acceptance curves, unconditional and conditional,
  side by side;
- position0_buckets.png: each spec run's position-0 acceptance by the previous round;
- throughput_vs_k.png: output throughput and median TPOT against num_speculative_tokens (k from
  len(per_position_acceptance), else the config), plain runs as dashed lines;
- acceptance_by_category.png: acceptance rate per prompt category (with more than one);
- summary.md: the runs, the main table (mtpx.metrics.report.format_comparison), position-0
  buckets, predictions and categories, and the figures.
It prints, for every ordered pair of spec runs (A, B), B's position-0 rate predicted from A's
conditional rates and B's mix (mtpx.metrics.analytics.predict_position0), with B's measured rate.
Runs that mix data sets or modes get a warning line (stderr and summary.md). Figures without
data are skipped. Names default to the spec method and k ("mtp8", "mtp1 k=3",
"no spec"). Exit status 2, with one error line, for a directory without metrics.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mtpx.io import atomic_write_text  # noqa: E402
from mtpx.metrics.dashboard import (  # noqa: E402
    RunDirError, dashboard_markdown, load_runs, mixed_runs_warning, position0_predictions,
    write_comparison_figures)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="eval run directories (with metrics.json)")
    ap.add_argument("--out", default="outputs/dashboard", help="folder for the PNGs and summary.md")
    ap.add_argument("--names", nargs="+", help="one display name per run, in order")
    args = ap.parse_args(argv)
    try:
        runs = load_runs(args.runs, args.names)
    except (RunDirError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    mixed = mixed_runs_warning(runs)
    if mixed:
        print(mixed, file=sys.stderr)
    out = Path(args.out)
    figures = write_comparison_figures(runs, out)
    summary = atomic_write_text(out / "summary.md", dashboard_markdown(runs, figures))
    predictions = position0_predictions(runs)
    if predictions:
        print("\n".join(predictions))
    elif sum(r.is_spec and r.analytics is not None for r in runs) < 2:
        print("no position-0 predictions: they need two spec runs with analytics in metrics.json")
    print(f"wrote {summary} and {len(figures)} figure(s): {', '.join(f.name for f in figures) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
