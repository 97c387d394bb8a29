"""One command alternated between two source trees: another commit (a git worktree) and this one.

    python tools/bench_ab.py --base COMMIT --out DIR --name NAME [--runs 2] [--sides base this]
        [--threads 1] [--copy PATH ...] [--dry-run] -- COMMAND ARG ...

The before/after kind of study (a kernel, a step form, a cost rule against the commit before it):
for run i in 1..runs and each side in `--sides` order, COMMAND runs with the side's tree as the
working directory and on PYTHONPATH (OMP_NUM_THREADS = --threads), its stdout and stderr written
to DIR/NAME_SIDE_i.txt. In COMMAND, `{out}` becomes DIR/NAME_SIDE_i (no suffix, absolute), so a
tool's own output lands beside the text: `tools/bench_floor.py ... --out {out}.json`.

The base side is a detached worktree of COMMIT at /tmp/mtpx_COMMIT, added if missing (--base-dir
names another checkout instead). --copy copies files of this tree into the base tree first (a
script or tool the old commit does not have). Exit status: 1 if any run failed, else 0.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def base_tree(commit: str, path: str | None = None) -> Path:
    """The checkout of `commit`: `path` if given, else /tmp/mtpx_<commit> (a detached git worktree,
    added if the folder is missing). Raises subprocess.CalledProcessError if git cannot add it."""
    tree = Path(path or f"/tmp/mtpx_{commit}")
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True)
    return tree.resolve()


def side_env(tree: Path, threads: int) -> dict[str, str]:
    """The environment a side runs in: its tree first on PYTHONPATH, OMP_NUM_THREADS = threads, and
    MTPX_DATA_DIR defaulting to ../shared/data next to this checkout when that folder exists."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    shared = ROOT.parent / "shared" / "data"
    if "MTPX_DATA_DIR" not in env and shared.is_dir():
        env["MTPX_DATA_DIR"] = str(shared)
    return env


def run_logged(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, dry_run: bool) -> int:
    """Run cmd in cwd with stdout and stderr to `log`; prints the command. Returns the exit status."""
    print(f"(cd {cwd} && {shlex.join(cmd)}) > {log} 2>&1", flush=True)
    if dry_run:
        return 0
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        return subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the other commit (the 'base' side)")
    ap.add_argument("--base-dir", help="a checkout of --base to use instead of /tmp/mtpx_COMMIT")
    ap.add_argument("--out", required=True, help="folder for NAME_SIDE_i.txt and the command's {out} files")
    ap.add_argument("--name", required=True)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--sides", nargs="+", default=["base", "this"], choices=["base", "this"],
                    help="order within a run, e.g. base this base")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--copy", nargs="*", default=[],
                    help="paths (relative to this tree) copied into the base tree")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- COMMAND ARG ... ({out}: the run's output prefix)")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --")
    if args.dry_run:
        base = Path(args.base_dir or f"/tmp/mtpx_{args.base}")
    else:
        base = base_tree(args.base, args.base_dir)
    for rel in args.copy:
        if not args.dry_run:
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, base / rel)
    out = Path(args.out).resolve()
    failed = 0
    for i in range(1, args.runs + 1):
        seen: dict[str, int] = {}
        for side in args.sides:
            seen[side] = seen.get(side, 0) + 1
            tag = f"{i}" if seen[side] == 1 else f"{i}{'abcdefgh'[seen[side] - 1]}"
            tree = base if side == "base" else ROOT
            prefix = out / f"{args.name}_{side}_{tag}"
            cmd = [part.replace("{out}", str(prefix)) for part in command]
            log = prefix.with_suffix(".txt")
            failed |= run_logged(cmd, tree, side_env(tree, args.threads), log, args.dry_run) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
