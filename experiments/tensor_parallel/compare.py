"""Tables of experiments/tensor_parallel (run.sh): tokens of TP=2 against TP=1 request by request,
and tok/s side by side. `python experiments/tensor_parallel/compare.py` (after run.sh)."""
from __future__ import annotations

import json
from pathlib import Path

RUNS = Path(__file__).resolve().parent / "runs"


def load(name: str):
    d = RUNS / name
    outs = {}
    for line in (d / "outputs.jsonl").read_text().splitlines():
        r = json.loads(line)
        outs[r["index"]] = r["output_token_ids"]
    return outs, json.loads((d / "metrics.json").read_text())


def present(specs) -> tuple:
    """The specs whose TP=1 and TP=2 concurrency-64 runs exist (the compiled pair is optional)."""
    return tuple(s for s in specs if all((RUNS / f"{s}_tp{n}_c64").is_dir() for n in (1, 2)))


SPECS = ("plain", "mtp1", "mtp8", "mtp8_prefix", "mtp8_auto", "mtp8_compiled")


def main() -> None:
    print("## Tokens: TP=2 against TP=1 (GSM8K test, first 32 prompts, greedy, max 256 tokens, concurrency 64)\n")
    print("| run | requests | identical | differing | tokens compared |")
    print("|---|---:|---:|---:|---:|")
    for spec in present(SPECS):
        one, _ = load(f"{spec}_tp1_c64")
        two, _ = load(f"{spec}_tp2_c64")
        same = sum(one[i] == two[i] for i in one)
        print(f"| {spec} | {len(one)} | {same} | {len(one) - same} | {sum(len(t) for t in one.values()):,} |")
    for spec in present(SPECS):     # every run decodes the same greedy tokens (lossless)
        one, _ = load(f"{spec}_tp1_c64")
        base, _ = load("plain_tp1_c64")
        assert one == base, f"{spec} differs from plain decoding"
    print("\nEvery run's tokens also equal plain TP=1's (the speculative runs are lossless).\n")
    print("## Output tok/s (eager but mtp8_compiled, 1 thread per process; indicative: other jobs share the 2 cores)\n")
    print("| run | concurrency | prompts | TP=1 tok/s | TP=2 tok/s | TP=2 / TP=1 | acceptance length TP=1 / TP=2 |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for conc, n in ((1, 4), (64, 32)):
        for spec in ("plain", "mtp1", "mtp8") if conc == 1 else present(SPECS):
            _, m1 = load(f"{spec}_tp1_c{conc}")
            _, m2 = load(f"{spec}_tp2_c{conc}")
            t1, t2 = m1["output_throughput"], m2["output_throughput"]
            al = (f"{m1['acceptance_length']:.2f} / {m2['acceptance_length']:.2f}"
                  if m1.get("acceptance_length") else "—")
            print(f"| {spec} | {conc} | {n} | {t1:.1f} | {t2:.1f} | {t2 / t1:.2f} | {al} |")


if __name__ == "__main__":
    main()
