"""Print the recipe tables of experiments/training_recipes/README.md from run.sh's eval folders.

    python experiments/training_recipes/table.py [RUNS] [N]   # RUNS: run.sh's folder; N prompts (32)

Computed from each eval's outputs.jsonl over its first N prompts (so runs of more prompts compare
on the same ones): mean accepted tokens per draft = accepted draft tokens / drafting rounds (the
acceptance length less the bonus token); per-position acceptance: the share of rounds whose j-th
draft was accepted (mtpx/metrics/analytics.py's unconditional rate).
"""
import json
import random
import sys
from pathlib import Path

runs = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/mtpx_recipes3")
N = int(sys.argv[2]) if len(sys.argv) > 2 else 32
ROWS = {"mtp8": [("base", "shipped heads"), ("ce", "self-distilled, ce"), ("kl", "self-distilled, kl"),
                 ("lk", "self-distilled, lk_hybrid"),
                 ("lk_tf", "self-distilled, lk_hybrid, teacher-forced inputs (mtp_hidden_input=target)"),
                 ("ce_s150", "self-distilled, ce, 150 steps"),
                 ("kl_s150", "self-distilled, kl, 150 steps"),
                 ("lk_s150", "self-distilled, lk_hybrid, 150 steps"),
                 ("ce_tf_s150", "self-distilled, ce, teacher-forced inputs (mtp_hidden_input=target), "
                                "150 steps"),
                 ("ce_s300", "self-distilled, ce, 300 steps"),
                 ("posthoc_s150", "modules 4-7 added fresh to modules 0-3 (frozen), ce, 150 steps"),
                 ("posthoc_copy_s150", "modules 4-7 added as copies of module 3, 0-3 frozen, ce, 150 steps"),
                 ("ce_mix_s150", "GSM8K + code answers by tokens (39% GSM8K rows), ce, 150 steps"),
                 ("ce_mix_s300", "GSM8K + code answers by tokens (39% GSM8K rows), ce, 300 steps"),
                 ("ce_mix3_s150", "GSM8K + code answers 3:1 (75% GSM8K rows), ce, 150 steps"),
                 ("ce_mix3_s300", "GSM8K + code answers 3:1 (75% GSM8K rows), ce, 300 steps"),
                 ("ce_mix7_s300", "GSM8K + code answers 7:1 (88% GSM8K rows), ce, 300 steps")],
        "mtp1": [("base", "shipped module 0"), ("ce", "module 0 of the ce heads"),
                 ("lk", "module 0 of the lk_hybrid heads"),
                 ("mtp1_unroll", "module 0, lk_hybrid, unroll 3"),
                 ("mtp1_ttt", "module 0, lk_hybrid, unroll 3 + training-time test")]}


def metrics(name: str, spec: str, k: int, data: str) -> dict | None:
    """{"num_accepted_tokens", "num_drafts", "acceptance_length", "per_position_acceptance"} over
    the first N requests, or None when the eval has not run (or has fewer than N requests)."""
    f = runs / f"eval_{name}_{spec}_k{k}_{data}" / "outputs.jsonl"
    if not (f.parent / "metrics.json").is_file():
        return None
    reqs = sorted((json.loads(line) for line in f.read_text().splitlines()), key=lambda r: r["index"])[:N]
    if len(reqs) < N:
        return None
    per_prompt = [[r for r in q["rounds"] if r[0] > 0] for q in reqs]
    rounds = [r for q in per_prompt for r in q]
    acc = sum(r[1] for r in rounds)
    return {"num_accepted_tokens": acc, "num_drafts": len(rounds), "per_prompt": per_prompt,
            "acceptance_length": sum(r[2] for r in rounds) / len(rounds),
            "per_position_acceptance": [sum(r[1] > i for r in rounds) / len(rounds) for i in range(k)]}


def ratio_ci(m: dict, b: dict, resamples: int = 1000) -> str:
    """95% interval of accepted/draft(m) / accepted/draft(b) - 1 from a paired bootstrap over the
    prompts (both runs decode the same prompts to the same greedy tokens)."""
    rng, n, out = random.Random(0), len(m["per_prompt"]), []

    def acc(runs: dict, idx: list[int]) -> float:
        rounds = [r for i in idx for r in runs["per_prompt"][i]]
        return sum(r[1] for r in rounds) / len(rounds)
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        out.append(acc(m, idx) / acc(b, idx) - 1)
    out.sort()
    return f"{out[int(0.025 * resamples)]:+.1%}..{out[int(0.975 * resamples)]:+.1%}"


def train_wall(name: str) -> str:
    """Wall minutes of run.sh's `NAME train wall W s [cpu U+S s]` line, with the share of a core
    (CPU time / wall time) when the line has it."""
    log = runs / f"ft_{name}.log"
    for line in log.read_text().splitlines() if log.is_file() else []:
        if " train wall " in line:
            words = line.split()
            wall = float(words[3])
            if len(words) > 6 and words[5] == "cpu":
                return f"{wall / 60:.0f} min ({sum(map(float, words[6].split('+'))) / wall:.0%} of a core)"
            return f"{wall / 60:.0f} min"
    return "-"


for spec, k in (("mtp8", 8), ("mtp1", 3)):
    print(f"\n{spec} k = {k}: mean accepted tokens per draft (vs shipped), acceptance length, per-position "
          "acceptance, on GSM8K test and HumanEval\n")
    print("| heads | train time | GSM8K accepted/draft | vs shipped (95% CI) | length | per position | "
          "HumanEval accepted/draft | vs shipped (95% CI) | per position |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---|")
    base = {d: metrics("base", spec, k, d) for d in ("gsm8k", "humaneval")}
    for name, label in ROWS[spec]:
        if all(metrics(name, spec, k, d) is None for d in ("gsm8k", "humaneval")):
            continue                                       # a recipe not run (or not evaluated)
        cells = [label, "-" if name == "base" else train_wall(name)]
        for d in ("gsm8k", "humaneval"):
            m, b = metrics(name, spec, k, d), base[d]
            if m is None:
                cells += ["-"] * (4 if d == "gsm8k" else 3)
                continue
            acc = m["num_accepted_tokens"] / m["num_drafts"]
            rel = "-" if b is None else f"{acc / (b['num_accepted_tokens'] / b['num_drafts']) - 1:+.1%}"
            if b is not None and name != "base":
                rel += f" ({ratio_ci(m, b)})"
            pos = " ".join(f"{x:.2f}" for x in m["per_position_acceptance"])
            cells += [f"{acc:.3f}", rel] + ([f"{m['acceptance_length']:.3f}"] if d == "gsm8k" else []) + [pos]
        print("| " + " | ".join(cells) + " |")
