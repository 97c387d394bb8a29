"""Tables of experiments/tensor_parallel (run.sh): tokens of TP=2 against TP=1 request by request
for every pair of runs (and each run against plain TP=1 eager), tok/s side by side, and the
start-up costs (compiled graphs, automatic k's calibration).
`python experiments/tensor_parallel/compare.py` (after run.sh); a pair not run is listed as such."""
from __future__ import annotations

import json
from pathlib import Path

RUNS = Path(__file__).resolve().parent / "runs"
BASE = "plain_tp1_c64"      # plain decoding, TP=1, eager, no prefix caching: the reference tokens

# (pair name: runs/<name>_tp1_c64 and runs/<name>_tp2_c64, spec, k, prefix caching, engine.compile,
#  the plain TP=1 eager run without prefix caching on the same prompts)
PAIRS = [(f"{spec}{auto}{comp}{pre}", spec, "auto" if auto else "fixed", bool(pre), bool(comp), BASE)
         for comp in ("", "_compiled") for pre in ("", "_prefix")
         for spec, auto in (("plain", ""), ("mtp1", ""), ("mtp8", ""), ("mtp8", "_auto"))]
# data.num_fewshot=2: every prompt starts with the same two solved train examples, so prefix
# caching has hits (the zero-shot prompts share under one 16-token block: no hits)
PAIRS += [(f"mtp8{comp}_fewshot_prefix", "mtp8", "fixed", True, bool(comp), "plain_fewshot_tp1_c64")
          for comp in ("", "_compiled")]


def load(name: str):
    """-> ({request index: output token ids}, metrics.json) of runs/<name>."""
    d = RUNS / name
    outs = {}
    for line in (d / "outputs.jsonl").read_text().splitlines():
        r = json.loads(line)
        outs[r["index"]] = r["output_token_ids"]
    return outs, json.loads((d / "metrics.json").read_text())


def exists(name: str) -> bool:
    return (RUNS / name / "outputs.jsonl").is_file() and (RUNS / name / "metrics.json").is_file()


def first_diff(a: list, b: list) -> int | None:
    """The first position where two token lists differ (a length difference counts), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def yes_no(outs: dict, base: dict) -> str:
    return "yes" if outs == base else f"no ({sum(outs.get(i) != t for i, t in base.items())} differ)"


def pair(m1: dict, m2: dict, key: str) -> str:
    """ "x / y" of metrics.json's `key` at TP=1 and TP=2 (— where null: no drafts, no prefix caching)."""
    v = [m.get(key) for m in (m1, m2)]
    return "—" if v == [None, None] else " / ".join("—" if x is None else f"{x:.2f}" for x in v)


def main() -> None:
    print("## Tokens: TP=2 against TP=1 (GSM8K test, first 32 prompts, greedy, max 256 tokens, concurrency "
          "64)\n")
    print("Each pair's TP=1 and TP=2 runs compared request by request; the last two columns compare "
          "each run with plain TP=1 eager without prefix caching on the same prompts (`plain_tp1_c64`; "
          "`plain_fewshot_tp1_c64` for the `fewshot` pairs, whose prompts start with 2 solved examples, "
          "data.num_fewshot=2).\n")
    print("| run | spec | k | prefix caching | compile | requests | identical | differing | tokens compared "
          "| TP=1 = plain TP=1 eager | TP=2 = plain TP=1 eager |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---|---|")
    diffs, missing = [], []
    for name, spec, k, prefix, comp, ref in PAIRS:
        runs = [f"{name}_tp{n}_c64" for n in (1, 2)]
        if not all(exists(r) for r in (*runs, ref)):
            missing.append(name)
            continue
        one, _ = load(runs[0])
        two, _ = load(runs[1])
        base, _ = load(ref)
        same = sum(one[i] == two.get(i) for i in one)
        diffs += [(name, i, first_diff(one[i], two[i])) for i in sorted(one) if one[i] != two.get(i)]
        print(f"| {name} | {spec} | {k} | {'on' if prefix else 'off'} | {'yes' if comp else 'no'} | "
              f"{len(one)} | {same} | {len(one) - same} | {sum(len(t) for t in one.values()):,} "
              f"| {yes_no(one, base)} | {yes_no(two, base)} |")
    if missing:
        print(f"\nNot run: {', '.join(missing)}.")
    if diffs:
        print("\nDiffering requests (pair, request index, first differing output position):\n")
        for name, i, pos in diffs:
            print(f"- {name}: request {i}, position {pos}")
    present = [p for p in PAIRS if p[0] not in missing]

    print("\n## Output tok/s (1 thread per process; indicative: other jobs share the 2 cores)\n")
    print("| run | compile | concurrency | prompts | TP=1 tok/s | TP=2 tok/s | TP=2 / TP=1 "
          "| acceptance length TP=1 / TP=2 | prefix cache hit rate TP=1 / TP=2 |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    rows = [(s, False, 1, 4) for s in ("plain", "mtp1", "mtp8")] + [(p[0], p[4], 64, 32) for p in present]
    for name, comp, conc, n in rows:
        _, m1 = load(f"{name}_tp1_c{conc}")
        _, m2 = load(f"{name}_tp2_c{conc}")
        t1, t2 = m1["output_throughput"], m2["output_throughput"]
        al, hits = (pair(m1, m2, key) for key in ("acceptance_length", "prefix_cache_hit_rate"))
        print(f"| {name} | {'yes' if comp else 'no'} | {conc} | {n} | {t1:.1f} | {t2:.1f} | {t2 / t1:.2f} | "
              f"{al} | {hits} |")

    print("\n## Start-up: compiled graphs and automatic k's calibration (seconds; contended machine)\n")
    print("| run | TP | graphs | compiled | loaded from cache | build s | calibration s (source) "
          "| automatic k: steps by k |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for name, _, k, _, comp, _ in present:
        if not comp and k != "auto":
            continue
        for n in (1, 2):
            _, m = load(f"{name}_tp{n}_c64")
            c = m.get("compile") or {}
            cal = (m.get("auto_k") or {}).get("calibration") or {}
            src = cal.get("source", "").split(",")[0].split(" from")[0]
            build = (f"| {c['num_graphs']} | {c['num_compiled']} | {c['num_loaded']} | {c['compile_s']:.0f} "
                     if c else "| — | — | — | — ")
            calib = f"{cal['seconds']:.0f} ({src})" if cal else "—"
            ks = ", ".join(f"{k}: {c}" for k, c in sorted(m.get("k_histogram", {}).items(),
                                                          key=lambda x: int(x[0])))
            print(f"| {name} | {n} {build}| {calib} | {ks or '—'} |")


if __name__ == "__main__":
    main()
