"""Named `train_or_eval.py` runs with shared overrides, then their comparison table.

    python tools/eval_runs.py --out DIR [--runs-dir outputs/NAME] [--common "data=gsm8k ..."]
        --run "NAME=OVERRIDE ..." [--run ...] [--table table.md] [--plot acceptance.png] [--dry-run]

The eval kind of study (the full GSM8K set without speculation, with mtp1 and mtp8; prefix
caching off and on; standard against block verification; mode=bench runs): each --run NAME=
OVERRIDES runs `python train_or_eval.py COMMON OVERRIDES hydra.run.dir=RUNS_DIR/NAME` (mode=eval
unless the overrides say otherwise), then tools/compare_runs.py writes DIR/TABLE (one column per
run; the speculative runs' per-position acceptance into DIR/PLOT when given). The run folders
(metrics.json, per-request outputs) stay under RUNS_DIR, outside the tree (outputs/ is ignored).
Exit status 1 if a run or the comparison failed.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_run(item: str) -> tuple[str, list[str]]:
    """'NAME=OVERRIDE ...' -> (NAME, [OVERRIDE, ...]). Raises ValueError without a name."""
    name, sep, rest = item.partition("=")
    if not sep or not name or " " in name:
        raise ValueError(f"--run {item!r}: expected NAME=OVERRIDES (NAME without spaces)")
    return name, shlex.split(rest)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the study folder (gets the table and plot)")
    ap.add_argument("--runs-dir", help="where the runs go (default outputs/<the out folder's name>)")
    ap.add_argument("--common", default="", help="overrides every run gets")
    ap.add_argument("--run", action="append", required=True, metavar="NAME=OVERRIDES")
    ap.add_argument("--table", default="table.md")
    ap.add_argument("--plot", help="per-position acceptance PNG name in --out")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    try:
        runs = [parse_run(item) for item in args.run]
    except ValueError as e:
        ap.error(str(e))
    out = Path(args.out)
    runs_dir = Path(args.runs_dir or ROOT / "outputs" / out.name)
    failed = False
    for name, overrides in runs:
        cmd = [sys.executable, "train_or_eval.py", *shlex.split(args.common), *overrides,
               f"hydra.run.dir={runs_dir / name}"]
        print(shlex.join(cmd), flush=True)
        if not args.dry_run:
            failed |= subprocess.run(cmd, cwd=ROOT).returncode != 0
    compare = [sys.executable, "tools/compare_runs.py", *[f"{name}={runs_dir / name}" for name, _ in runs]]
    if args.plot:
        compare += ["--plot", str(out / args.plot)]
    print(shlex.join(compare) + f" > {out / args.table}", flush=True)
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(compare, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        (out / args.table).write_text(done.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
