"""Pair before_after.py's outputs: python experiments/decode_step/summarize.py BEFORE.json... -- AFTER.json...
-> a markdown table of output tok/s (median over processes and repeats) and after / before ratios
(min-max over the paired processes), and whether every output token agrees."""
import json
import statistics
import sys

i = sys.argv.index("--")
before = [json.load(open(p)) for p in sys.argv[1:i]]
after = [json.load(open(p)) for p in sys.argv[i + 1:]]


def speeds(runs, key):
    return [r["tok_s"] for run in runs for r in run["rows"]
            if (r["engine"], r["mode"], r["concurrency"]) == key]


keys = sorted({(r["engine"], r["mode"], r["concurrency"]) for r in before[0]["rows"]},
              key=lambda k: (k[1], k[2], k[0]))
print("| engine | mode | concurrency | before tok/s | after tok/s | after / before (median) | per pair "
      "min-max |")
print("|---|---|---:|---:|---:|---:|---|")
for key in keys:
    b, a = speeds(before, key), speeds(after, key)
    pairs = [y / x for x, y in zip(b, a)]
    print(f"| {key[0]} | {key[1]} | {key[2]} | {statistics.median(b):.1f} | {statistics.median(a):.1f} | "
          f"{statistics.median(a) / statistics.median(b):.3f} | {min(pairs):.3f}-{max(pairs):.3f} |")
same = all(before[0]["tokens"][k] == run["tokens"][k] for run in before + after for k in before[0]["tokens"])
print(f"\nIdentical output tokens in every run of both commits: {same}")
print("Builds (s): " + "; ".join(f"{'before' if j < len(before) else 'after'} {run['builds']}"
                               for j, run in enumerate(before + after)))
