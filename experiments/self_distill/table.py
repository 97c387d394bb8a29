"""The results table of experiments/self_distill from metrics/*.json and the fine-tune runs' losses.csv.

    python experiments/self_distill/table.py [RUNS]   (RUNS default /work/runs) -> prints Markdown
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/runs")
NAMES = {"base": "original heads (checkpoints/demo)", "human": "fine-tuned, GSM8K-train human answers",
         "distill": "fine-tuned, self-distilled answers",
         "distill_decay": "fine-tuned, self-distilled, decay 0.6",
         "mtp1_distill": "module 0 only, self-distilled, 1 depth",
         "mtp1_unroll": "module 0 only, self-distilled, unroll 4"}


def metrics(tag: str) -> dict | None:
    f = HERE / "metrics" / f"{tag}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def cell(m: dict | None) -> str:
    if m is None:
        return "-"
    return f"{m['acceptance_length']:.2f} ({m['acceptance_rate']:.3f})"


def per_position(title: str, suffix: str, names) -> None:
    print()
    print(title)
    print()
    for name in names:
        m = metrics(f"{name}_{suffix}")
        if m:
            print(f"- {name}: " + " ".join(f"{p:.3f}" for p in m["per_position_acceptance"]))


def final_val(name: str) -> dict[str, float]:
    f = RUNS / f"ft_{name}" / "losses.csv"
    if not f.is_file():
        return {}
    rows = [r for r in csv.DictReader(f.open()) if r["split"] == "val"]
    return {k: float(v) for k, v in rows[-1].items() if k.startswith("mtp") and v} if rows else {}


def main() -> None:
    print("| heads | mtp1 k=1 | mtp1 k=4 | mtp8 k=8 | GSM8K accuracy (mtp8 run) |")
    print("|---|---:|---:|---:|---:|")
    for name, label in NAMES.items():
        m8 = metrics(f"{name}_mtp8")
        acc = f"{m8['accuracy']:.3f}" if m8 and m8.get("accuracy") is not None else "-"
        print(f"| {label} | {cell(metrics(f'{name}_mtp1'))} | {cell(metrics(f'{name}_mtp1_k4'))} | "
              f"{cell(m8)} | {acc} |")
    per_position("Per-position acceptance, mtp8 (position 1 .. 8):", "mtp8",
                 ("base", "human", "distill", "distill_decay"))
    per_position("Per-position acceptance, mtp1 k=4 (module 0 applied 4 times; position 1 .. 4):", "mtp1_k4",
                 ("base", "distill", "mtp1_distill", "mtp1_unroll"))
    print()
    print("Final validation loss per depth of each fine-tune (its own data's held-out 5%; nats/token):")
    print()
    for name in NAMES:
        v = final_val(name)
        if v:
            print(f"- {name}: " + " ".join(f"{k} {x:.3f}" for k, x in v.items()))


if __name__ == "__main__":
    main()
