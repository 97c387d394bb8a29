"""Compare eval runs side by side: `python tools/compare_runs.py NAME=RUN_DIR [NAME=RUN_DIR ...]`.

Reads each run directory's metrics.json and prints one markdown table (columns = runs), and with
--plot PATH a grouped per-position acceptance bar chart of the spec runs.
"""
import argparse
import json
import sys
from pathlib import Path

from mtpx.metrics.logging import plot_per_position_acceptance
from mtpx.metrics.report import format_comparison


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="NAME=RUN_DIR (a folder with metrics.json)")
    ap.add_argument("--plot", help="write a per-position acceptance PNG here")
    args = ap.parse_args(argv)
    rows = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = Path(item).name, item
        file = Path(path) / "metrics.json"
        if not file.is_file():
            print(f"error: {file} not found: pass run directories written by mode=eval", file=sys.stderr)
            return 2
        rows[name] = json.loads(file.read_text())
    print(format_comparison(rows), end="")
    if args.plot:
        spec_runs = {n: m for n, m in rows.items() if m.get("per_position_acceptance")}
        plot_per_position_acceptance(spec_runs, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
