"""Issue 37's concurrency matrix into one folder: contenders x concurrency x eager / compiled, each
cell one tools/bench_speedup.py process (the contenders side by side, chunks alternated).

    python tools/bench_matrix.py --out DIR [--cells eager_c1 compiled_c16 ...] [--warm-up]
        [--contenders ...] [--extra-contenders auto+per_request_k=true] [--num-prompts 128]
        [--max-tokens 128] [--threads 1] [--rounds N] [--dry-run]
        [--base COMMIT [--sides base this base] [--base-contenders plain mtp4]]

A cell is MODE_cN[_16][_again]: MODE eager or compiled, N the concurrency; `_16` runs 16 chunks
(of num_prompts / 16 prompts) instead of 4, `_again` is the same cell once more (the compiled
cells' first run after a source change builds graphs inside its measured chunks). Default cells:
compiled then eager at 1, 4, 16 and 64. Contenders by concurrency: plain mtp4 mtp8 auto at 1 and
4, plain mtp4 auto at 16, plain mtp1 mtp4 auto at 64 (the ones that can win there); 4 chunks, 2 at
64 (a chunk of 32 prompts never fills a batch of 64).

--warm-up first runs each compiled concurrency on 4 prompts of 8 tokens into a temporary folder,
so every graph and step-cost calibration of this source is built and saved before a measured cell.
--base COMMIT runs every cell in that commit's worktree too (tools/bench_ab.py's /tmp/mtpx_COMMIT),
in --sides order, into CELL_SIDE_i; --base-contenders gives the base side other contenders (the
ones an old commit knows).

Writes DIR/CELL/speedup.md and .json and DIR/CELL.log (bench_speedup's), DIR/machine.txt, and
DIR/matrix.md: the machine and every cell's speedup.md in order (the summary to keep; the logs and
JSON are raw output, ignored by experiments/.gitignore). Exit status 1 if any cell failed.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ab import ROOT, base_tree, run_logged, side_env  # noqa: E402

DEFAULT_CELLS = [f"{mode}_c{c}" for mode in ("compiled", "eager") for c in (1, 4, 16, 64)]
CONTENDERS = {1: ["plain", "mtp4", "mtp8", "auto"], 4: ["plain", "mtp4", "mtp8", "auto"],
              16: ["plain", "mtp4", "auto"], 64: ["plain", "mtp1", "mtp4", "auto"]}
CELL = re.compile(r"^(eager|compiled)_c(\d+)(_16)?(_again)?$")


def cell_args(cell: str, args, contenders: list[str] | None = None) -> list[str]:
    """bench_speedup.py's arguments for one cell name (`contenders` replaces the cell's own and the
    extra ones). Raises ValueError on a malformed name."""
    m = CELL.match(cell)
    if not m:
        raise ValueError(f"cell {cell!r}: expected MODE_cN[_16][_again], MODE eager or compiled")
    mode, conc, sixteen = m.group(1), int(m.group(2)), m.group(3)
    rounds = 16 if sixteen else args.rounds or (2 if conc >= 64 else 4)
    if contenders is None:
        contenders = [*(args.contenders or CONTENDERS.get(conc, CONTENDERS[16])), *args.extra_contenders]
    out = ["--concurrency", str(conc), "--rounds", str(rounds), "--contenders", *contenders,
           "--num-prompts", str(args.num_prompts), "--max-tokens", str(args.max_tokens),
           "--threads", str(args.threads)]
    return out + (["--compile"] if mode == "compiled" else [])


def machine() -> str:
    """The CPU's model name and AVX flags (the line each study's machine.txt held)."""
    name, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags |= {f for f in line.split(":", 1)[1].split() if f.startswith("avx")}
    except OSError:
        pass
    return f"{name}; {' '.join(sorted(flags)) or 'no AVX flags read'}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", nargs="+", default=DEFAULT_CELLS)
    ap.add_argument("--warm-up", action="store_true", help="build every compiled graph and calibration first")
    ap.add_argument("--contenders", nargs="+",
                    help="the same contenders in every cell (default: by concurrency)")
    ap.add_argument("--extra-contenders", nargs="+", default=[],
                    help="appended in every cell, e.g. auto+per_request_k=true")
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int,
                    help="chunks per cell (default 4, 2 at concurrency 64; _16 cells 16)")
    ap.add_argument("--base", help="also run each cell in this commit's worktree")
    ap.add_argument("--sides", nargs="+", default=["base", "this"], choices=["base", "this"])
    ap.add_argument("--base-contenders", nargs="+", help="the base side's contenders (default: the same)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    try:
        cells = [(cell, cell_args(cell, args)) for cell in args.cells]
    except ValueError as e:
        ap.error(str(e))
    out = Path(args.out).resolve()
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        (out / "machine.txt").write_text(machine() + "\n")
    bench = [sys.executable, "tools/bench_speedup.py"]
    env = side_env(ROOT, args.threads)
    failed = 0
    if args.warm_up:
        if args.dry_run:
            warm = Path(tempfile.gettempdir(), "mtpx_warm")
        else:
            warm = Path(tempfile.mkdtemp(prefix="mtpx_warm_"))
        for conc in sorted({int(CELL.match(c).group(2)) for c, _ in cells if c.startswith("compiled")}):
            cmd = bench + ["--compile", "--concurrency", str(conc), "--rounds", "1", "--num-prompts", "4",
                           "--max-tokens", "8", "--threads", str(args.threads), "--contenders",
                           *(args.contenders or CONTENDERS.get(conc, CONTENDERS[16])),
                           "--out", str(warm / f"c{conc}")]
            failed |= run_logged(cmd, ROOT, env, warm / f"c{conc}.log", args.dry_run) != 0
    base = None
    if args.base:
        base = Path(f"/tmp/mtpx_{args.base}") if args.dry_run else base_tree(args.base)
    names = []
    for cell, cargs in cells:
        runs = [(cell, ROOT, cargs)]
        if base is not None:
            runs, seen = [], {}
            for side in args.sides:
                seen[side] = seen.get(side, 0) + 1
                sargs = cargs if side == "this" or not args.base_contenders else \
                    cell_args(cell, args, args.base_contenders)
                runs.append((f"{cell}_{side}_{seen[side]}", base if side == "base" else ROOT, sargs))
        for name, tree, sargs in runs:
            cmd = bench + sargs + ["--out", str(out / name)]
            log = out / f"{name}.log"
            failed |= run_logged(cmd, tree, side_env(tree, args.threads), log, args.dry_run) != 0
            names.append(name)
    if not args.dry_run:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        parts = [f"# Concurrency matrix ({' '.join(args.cells)})\n",
                 f"Commit {commit}; machine: {machine()}\n"]
        for name in names:
            table = out / name / "speedup.md"
            body = table.read_text() if table.is_file() else "(no speedup.md: see the log)\n"
            parts.append(f"## {name}\n\n{body.replace('# Output', '### Output', 1)}")
        (out / "matrix.md").write_text("\n".join(parts))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
