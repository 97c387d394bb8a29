"""One markdown table of a Hydra multirun: `python tools/sweep_table.py MULTIRUN_DIR [--out FILE]`.

A multirun (`python train_or_eval.py -m +spec=mtp1,mtp8 spec.num_speculative_tokens=1,2,4,8 ...`)
writes one job folder per combination, multirun/DATE/TIME/N/, each with .hydra/overrides.yaml and
(once the job finished) metrics.json. This prints, and writes atomically to --out (default
MULTIRUN_DIR/sweep.md), one row per job: the overrides that differ between jobs first (the
shared ones are listed above the table), then acceptance rate, acceptance length, per-position
acceptance, output throughput, median TTFT / TPOT / ITL, lossless mismatches and the job number.
Jobs without metrics.json (failed, still running), jobs multirun.yaml lists but that never
started (the sweep stopped early), jobs with lossless mismatches or failed requests are listed
below the table with their reason. Exit status 2, with one error line, when MULTIRUN_DIR is not
a multirun folder; 0 otherwise (problems are reported in the table, not by the exit status).

`python tools/sweep_table.py --rules DIR [DIR ...] --out FILE.md [--pareto FILE.png]`: the lossy
jobs of one or more acceptance-rule multiruns (docs/acceptance_rules.md) as one compact table
(mtpx.metrics.pareto.rules_table) and, with --pareto, one Pareto figure over all of them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mtpx.io import atomic_write_text  # noqa: E402
from mtpx.metrics.dashboard import RunDirError  # noqa: E402
from mtpx.metrics.sweep import collect_sweep, sweep_table  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("multirun_dir", metavar="MULTIRUN_DIR", nargs="+",
                    help="a Hydra multirun folder (multirun/DATE/TIME); several with --rules")
    ap.add_argument("--out", help="markdown file to write (default: MULTIRUN_DIR/sweep.md)")
    ap.add_argument("--rules", action="store_true",
                    help="the compact acceptance-rule table over the lossy jobs of every MULTIRUN_DIR")
    ap.add_argument("--pareto", help="with --rules: also draw the Pareto figure of all their jobs here")
    args = ap.parse_args(argv)
    if args.rules:
        return _rules(args)
    if len(args.multirun_dir) > 1:
        print("error: several MULTIRUN_DIRs need --rules (one table over their lossy jobs)", file=sys.stderr)
        return 2
    args.multirun_dir = args.multirun_dir[0]
    try:
        jobs = collect_sweep(args.multirun_dir)
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = sweep_table(args.multirun_dir, jobs)
    out = atomic_write_text(Path(args.out) if args.out else Path(args.multirun_dir) / "sweep.md", text)
    print(text, end="")
    print(f"\nwrote {out}")
    return 0


def _rules(args) -> int:
    """--rules: one table (and figure) over the jobs of several multiruns."""
    from mtpx.metrics.pareto import rule_label, rules_table, write_pareto_figure
    metrics = []
    try:
        for d in args.multirun_dir:
            metrics += [j.metrics for j in collect_sweep(d)      # lossy jobs that measured their quality
                        if j.metrics is not None and isinstance(j.metrics.get("quality"), dict)]
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = rules_table(metrics)
    print(text, end="")
    if args.out:
        print(f"wrote {atomic_write_text(Path(args.out), text)}")
    if args.pareto:
        figure = write_pareto_figure([rule_label(m.get("acceptance")) for m in metrics], metrics, args.pareto)
        print(f"wrote {figure}" if figure else "no lossy job: no Pareto figure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
