"""A matrix of tools/bench_speedup.py runs as one markdown table: every run of every cell, automatic k
against the best fixed contender of that run (issue 72's must-show), and a summary per cell.

    python tools/matrix_table.py DIR [--out FILE.md]
    python tools/matrix_table.py --aa DIR        # A/A runs: plain against plain_b

DIR holds one folder per run, MODE_cN_rI (MODE eager or compiled, N the concurrency, I the run),
each with bench_speedup's speedup.json. Per run: plain decoding's output tok/s, every contender's
ratio to it (over all chunks), automatic k's ratio to the best fixed contender (the fixed one of
the highest tok/s, plain included) over all chunks and as the median over the chunks of the
chunk's ratio ("paired": the same chunk, generates rotated per chunk or steps interleaved:
bench_speedup's --interleave), its share of decode steps per k, the
requests per depth, and the requests whose greedy tokens differ from plain decoding's. Per cell:
the runs' paired auto / best (min-max) and whether every run meets the target (>= 0.97x the best,
>= 0.99x plain where plain is best), and that ratio bracketed over the build order (the geometric
mean of the runs that built plain first and of those that built it last, bench_speedup's
--build-reversed; the run column marks the latter "rev"). Prints the table; --out also writes it.

--aa: DIR holds MODE_cN_rI_TIMING folders (TIMING: chunks, interleave, or shared: interleaved with
--share-weights) of runs with the contenders plain and plain_b, two engines doing the same work:
per run plain_b / plain over all chunks, paired (median over the chunks) and the chunks' min-max,
and per timing mode the paired medians' spread.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

RUN = re.compile(r"^(eager|compiled)_c(\d+)_r(\d+)$")


def _rate(chunk: dict) -> float:
    return chunk["tokens"] / chunk["seconds"]


def paired(a: dict, b: dict) -> float:
    """Median over the chunks of a's chunk tok/s over b's (same chunks, same order)."""
    return statistics.median(_rate(x) / _rate(y) for x, y in zip(a["chunks"], b["chunks"]))


def _hist(counts: dict) -> list[tuple[int, int]]:
    return sorted((int(k), n) for k, n in counts.items())


def run_row(data: dict) -> dict:
    """One run's numbers (module doc) from its speedup.json."""
    rows = {r["contender"]: r for r in data["rows"]}
    auto, plain = rows["auto"], rows["plain"]
    fixed = [r for name, r in rows.items() if name != "auto"]
    best = max(fixed, key=lambda r: r["output_tok_s"])
    steps = auto["auto_k"]["k_histogram"]
    total = sum(steps.values()) or 1
    return {"plain": plain["output_tok_s"],
            "ratios": {name: r["output_tok_s"] / plain["output_tok_s"] for name, r in rows.items()},
            "best": best["contender"], "auto_best": auto["output_tok_s"] / best["output_tok_s"],
            "auto_best_paired": paired(auto, best), "auto_plain_paired": paired(auto, plain),
            "ks": ", ".join(f"{k}: {100 * n / total:.0f}%" for k, n in _hist(steps)),
            "depths": ", ".join(f"{d}: {n}" for d, n in _hist(auto["auto_k"].get("depth_histogram", {}))),
            "mismatches": sum(r.get("mismatches_vs_plain", 0) for r in rows.values())}


def meets(row: dict) -> bool:
    """The must-show's target for one run: paired auto / best >= 0.97, and >= 0.99 where plain is best."""
    return row["auto_best_paired"] >= (0.99 if row["best"] == "plain" else 0.97)


def table(folder: Path) -> str:
    runs = []
    for d in sorted(folder.iterdir()):
        m = RUN.match(d.name)
        if m and (d / "speedup.json").exists():
            data = json.loads((d / "speedup.json").read_text())
            row = run_row(data)
            row["reversed"] = bool(data["args"].get("build_reversed"))
            runs.append((m.group(1), int(m.group(2)), int(m.group(3)), row))
    runs.sort(key=lambda r: (r[0] != "compiled", r[1], r[2]))
    names = ["mtp1", "mtp4", "mtp8", "auto"]
    lines = ["| concurrency | mode | run | plain tok/s | " + " | ".join(names) + " | best fixed | auto / best"
             " (paired) | auto / plain (paired) | auto's k (steps) | depth (requests) | differing | target |",
             "|---|---|---|---:|" + "---:|" * len(names) + "---|---:|---:|---|---|---:|---|"]
    for mode, c, i, r in runs:
        cells = " | ".join(f"{r['ratios'][n]:.2f}x" if n in r["ratios"] else "-" for n in names)
        verdict = "meets" if meets(r) else "MISSES"
        run = f"r{i}{' rev' * r['reversed']}"
        lines.append(f"| {c} | {mode} | {run} | {r['plain']:.1f} | {cells} | {r['best']} | "
                     f"{r['auto_best']:.3f}x ({r['auto_best_paired']:.3f}x) | {r['auto_plain_paired']:.3f}x"
                     f" | {r['ks']} | {r['depths']} | {r['mismatches']} | {verdict} |")
    lines += ["", "| concurrency | mode | runs | auto / best, paired (min-max) | every run meets the target"
              " | bracketed: built plain first and last |", "|---|---|---:|---:|---|---:|"]
    cells: dict = {}
    for mode, c, _, r in runs:
        cells.setdefault((mode, c), []).append(r)
    for (mode, c), rs in sorted(cells.items(), key=lambda x: (x[0][0] != "compiled", x[0][1])):
        ps = [r["auto_best_paired"] for r in rs]
        lines.append(f"| {c} | {mode} | {len(rs)} | {min(ps):.3f}x-{max(ps):.3f}x | "
                     f"{'yes' if all(meets(r) for r in rs) else 'no'} | {_bracketed(rs)} |")
    return "\n".join(lines) + "\n"


def _bracketed(rows: list[dict]) -> str:
    """The geometric mean of the paired auto / best of the runs that built plain first (their own
    geometric mean) and of those that built it last (bench_speedup --build-reversed): an effect of
    the build order linear in an engine's position cancels; "-" without runs of both orders."""
    def gmean(xs):
        return statistics.geometric_mean(xs) if xs else None
    fwd = gmean([r["auto_best_paired"] for r in rows if not r["reversed"]])
    rev = gmean([r["auto_best_paired"] for r in rows if r["reversed"]])
    return "-" if fwd is None or rev is None else f"{(fwd * rev) ** 0.5:.3f}x"


AA_RUN = re.compile(r"^(eager|compiled)_c(\d+)_r(\d+)_(chunks|interleave|shared)$")


def aa_table(folder: Path) -> str:
    """The A/A table (module doc, --aa)."""
    runs = []
    for d in sorted(folder.iterdir()):
        m = AA_RUN.match(d.name)
        if m and (d / "speedup.json").exists():
            rows = {r["contender"]: r for r in json.loads((d / "speedup.json").read_text())["rows"]}
            a, b = rows["plain"], rows["plain_b"]
            chunk = [_rate(x) / _rate(y) for x, y in zip(b["chunks"], a["chunks"])]
            runs.append((m.group(4), m.group(1), int(m.group(2)), int(m.group(3)),
                         b["output_tok_s"] / a["output_tok_s"], paired(b, a), min(chunk), max(chunk)))
    runs.sort(key=lambda r: (["chunks", "interleave", "shared"].index(r[0]), r[1] != "compiled", r[2], r[3]))
    lines = ["| timing | mode | concurrency | run | plain_b / plain | paired | chunks min-max |",
             "|---|---|---:|---|---:|---:|---:|"]
    lines += [f"| {t} | {mode} | {c} | r{i} | {all_:.3f}x | {p:.3f}x | {lo:.3f}-{hi:.3f} |"
              for t, mode, c, i, all_, p, lo, hi in runs]
    lines += ["", "| timing | runs | paired, min-max | largest distance from 1.000 | chunks, min-max |",
              "|---|---:|---:|---:|---:|"]
    for t in ("chunks", "interleave", "shared"):
        mine = [r for r in runs if r[0] == t]
        if mine:
            ps = [r[5] for r in mine]
            lines.append(f"| {t} | {len(mine)} | {min(ps):.3f}x-{max(ps):.3f}x | "
                         f"{max(abs(p - 1) for p in ps):.3f} | {min(r[6] for r in mine):.3f}-"
                         f"{max(r[7] for r in mine):.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--aa", action="store_true", help="A/A runs (module doc)")
    a = ap.parse_args(argv)
    text = aa_table(a.folder) if a.aa else table(a.folder)
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
