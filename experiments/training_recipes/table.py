"""Print the recipe table of experiments/training_recipes/README.md from the runs' metrics.json.

    python experiments/training_recipes/table.py [RUNS]      # RUNS: run.sh's folder (/tmp/mtpx_recipes)
"""
import json
import sys
from pathlib import Path

runs = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/mtpx_recipes")
base = None
print("| heads | acceptance length | vs shipped | acceptance rate | drafts | per-position acceptance 1..8 |")
print("|---|---:|---:|---:|---:|---|")
for name in ["base", "ce", "kl", "lk_hybrid", "lk_nll"]:
    if not (runs / f"eval_{name}" / "metrics.json").is_file():
        continue
    m = json.loads((runs / f"eval_{name}" / "metrics.json").read_text())
    base = base or m["acceptance_length"]
    pos = " ".join(f"{x:.3f}" for x in m["per_position_acceptance"])
    print(f"| {name} | {m['acceptance_length']:.3f} | {m['acceptance_length'] / base - 1:+.1%} | "
          f"{m['acceptance_rate']:.3f} | {m['num_drafts']} | {pos} |")
