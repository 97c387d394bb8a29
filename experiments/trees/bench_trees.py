"""Chain against tree drafting on GSM8K or HumanEval prompts, contenders alternated in one process.

    python experiments/trees/bench_trees.py [--num-prompts 8] [--max-tokens 64] [--rounds 2] \
        [--threads 1] [--data gsm8k|humaneval] [--concurrency 1] [--only NAME ...] [--out DIR]

Each contender is one LLM (eager, or with --compile compiled, trees too; greedy, concurrency
--concurrency (max_num_seqs), the demo
checkpoint): plain decoding, chain mtp1 (k = 1 and k = 3), chain mtp8 (k = 8) and the tree shapes
in CONTENDERS (--only: those names; leaf trees run the chain's round, mtpx/spec_decode/tree_leaves.py,
and a name ending in " generic" builds its tree with the generic tree round instead; "mtp8 auto ..."
runs automatic k, alone or choosing per step between its chain and a leaf tree, docs/trees.md,
its step costs calibrated at start-up or loaded from the cache, not timed). The prompts
are cut into --rounds chunks; every contender generates each chunk, in an order rotated per chunk.
Per contender: the graphs its engine built, output tok/s (output tokens / generate wall time, over
all chunks), its ratio to plain and to the fastest chain of the run, acceptance length (1 +
accepted / rounds), drafts verified per round, and the requests whose tokens differ from plain
decoding's; trees.json also records each engine's build (seconds from the LLM call to a ready
engine, graphs compiled or loaded). Writes trees.json and trees.md into --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.data.humaneval import load_humaneval  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402
from mtpx.spec_decode import tree_leaves  # noqa: E402

MTP8_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0],
             [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]]
MTP1_TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]
MTP1_SMALL = [[0], [1], [0, 0], [0, 0, 0]]                  # the k=3 chain plus a second choice at depth 1
MTP8_SMALL = [[0], [1]] + [[0] * d for d in range(2, 9)]    # the k=8 chain plus a second choice at depth 1
# leaf trees (the chain plus sibling leaves, drafted by the chain's round: mtpx/spec_decode/tree_leaves.py),
# the leaves where the per-depth x rank stats put accepted second and third choices
MTP1_LEAVES = [[0], [1], [2], [0, 0], [0, 1], [0, 0, 0], [0, 0, 1]]     # chain 3 + (1,1) (1,2) (2,1) (3,1)
MTP1_LEAVES4 = MTP1_LEAVES[:6] + [[0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 1]]    # chain 4, and (4,1)
MTP8_LEAVES3 = [[0], [1], [0, 0], [0, 1], [0, 0, 0], [0, 0, 1]] + [[0] * d for d in range(4, 9)]
MTP8_LEAVES = [[0], [1], [2], [0, 0], [0, 1], [0, 0, 0], [0, 0, 1]] + [[0] * d for d in range(4, 9)]
CONTENDERS = {          # name: (spec, num_speculative_tokens, tree)
    "plain": (None, None, None),
    "mtp1 chain k=1": ("mtp1", 1, None),
    "mtp1 chain k=3": ("mtp1", 3, None),
    "mtp1 tree [2]": ("mtp1", None, [2]),
    "mtp1 tree chain3+1 (4)": ("mtp1", None, MTP1_SMALL),
    "mtp1 tree [2,1,1]": ("mtp1", None, [2, 1, 1]),
    "mtp1 tree preset (8)": ("mtp1", None, MTP1_TREE),
    "mtp8 chain k=8": ("mtp8", 8, None),
    "mtp8 tree chain8+1 (9)": ("mtp8", None, MTP8_SMALL),
    "mtp8 tree [2,1x7]": ("mtp8", None, [2, 1, 1, 1, 1, 1, 1, 1]),
    "mtp8 tree [2,2,1x6]": ("mtp8", None, [2, 2, 1, 1, 1, 1, 1, 1]),
    "mtp8 tree preset (12)": ("mtp8", None, MTP8_TREE),
    "mtp1 leaves 3+4 (7)": ("mtp1", None, MTP1_LEAVES),
    "mtp1 leaves 4+5 (9)": ("mtp1", None, MTP1_LEAVES4),
    "mtp8 leaves 8+3 (11)": ("mtp8", None, MTP8_LEAVES3),
    "mtp8 leaves 8+4 (12)": ("mtp8", None, MTP8_LEAVES),
    "mtp1 tree chain3+1 (4) generic": ("mtp1", None, MTP1_SMALL),
    "mtp8 tree chain8+1 (9) generic": ("mtp8", None, MTP8_SMALL),
    "mtp8 leaves 8+4 (12) generic": ("mtp8", None, MTP8_LEAVES),
    "mtp1 dynamic (8; d4, k2)": ("mtp1", None, {"num_draft_tokens": 8, "depth": 4, "topk": 2}),
    "mtp8 dynamic (10; d5, k2)": ("mtp8", None, {"num_draft_tokens": 10, "depth": 5, "topk": 2}),
    "mtp8 dynamic (14; d8, k2)": ("mtp8", None, {"num_draft_tokens": 14, "depth": 8, "topk": 2}),
    # automatic k (num_speculative_tokens=auto), alone and choosing per step between its chain and a leaf tree
    "mtp8 auto k": ("mtp8", "auto", None),
    "mtp8 auto: chain or tree chain8+1 (9)": ("mtp8", "auto", MTP8_SMALL),
    "mtp8 auto: chain or leaves 8+4 (12)": ("mtp8", "auto", MTP8_LEAVES),
}



def load_prompts(data: str, num: int) -> list[str]:
    """The first `num` prompts of GSM8K test ("gsm8k") or HumanEval ("humaneval") from the data folder."""
    root = data_dir(ROOT / "conf")
    if data == "gsm8k":
        prompts = [format_prompt(r["question"]) for r in load_gsm8k(root / "gsm8k" / "test.jsonl")]
    else:
        prompts = [r["prompt"] for r in load_humaneval(root / "humaneval" / "HumanEval.jsonl.gz")]
    return prompts[:num]


def k_of(name: str) -> bool:
    """Whether the contender runs automatic k (num_speculative_tokens=auto)."""
    return CONTENDERS[name][1] == "auto"


def run_stats(p: dict, plain: dict) -> tuple[float, float, int]:
    """(output tok/s, acceptance length, requests differing from plain) of one contender's totals
    p (tokens, seconds, accepted, rounds, outputs) against plain decoding's."""
    tps = p["tokens"] / p["seconds"]
    al = 1 + p["accepted"] / p["rounds"] if p["rounds"] else 1.0
    return tps, al, sum(a != b for a, b in zip(p["outputs"], plain["outputs"]))


def write_results(args, stem: str, results, table: list[str]) -> None:
    """args.out/STEM.json (the arguments and results) and STEM.md (the table), and print the table."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(dict(args=vars(args), results=results), indent=1) + "\n")
    (out / f"{stem}.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", choices=["gsm8k", "humaneval"], default="gsm8k")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--only", nargs="*", help="contender names (default: all); plain always runs")
    ap.add_argument("--compile", action="store_true", help="every contender with engine.compile=true")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "trees"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    prompts = load_prompts(args.data, args.num_prompts)
    chunks = [prompts[i:: args.rounds] for i in range(args.rounds)]
    params = SamplingParams(max_tokens=args.max_tokens)
    names = [n for n in CONTENDERS if n == "plain" or not args.only or n in args.only]
    llms, built = {}, {}
    for name in names:          # built: seconds to a ready engine (graphs compiled or loaded), graphs
        t0 = time.perf_counter()
        spec, k, tree = CONTENDERS[name]
        tree_leaves.use_leaves = not name.endswith(" generic")      # generic: the tree round drafts it
        llms[name] = LLM(model=args.model, spec=spec, num_speculative_tokens=k, tree=tree,
                         max_num_seqs=args.concurrency, compile=args.compile, max_model_len=1024)
        stats = llms[name].engine.compile_stats() or {}
        built[name] = dict(built_s=round(time.perf_counter() - t0, 1), graphs=stats.get("num_graphs", 0),
                           compiled=stats.get("num_compiled", 0), loaded=stats.get("num_loaded", 0))
    per = {n: {"tokens": 0, "seconds": 0.0, "accepted": 0, "rounds": 0, "drafts": 0, "outputs": []}
           for n in names}
    for c, chunk in enumerate(chunks):
        for name in names[c % len(names):] + names[: c % len(names)]:
            t0 = time.perf_counter()
            outs = llms[name].generate(chunk, params)
            p = per[name]
            p["seconds"] += time.perf_counter() - t0
            p["tokens"] += sum(len(o.output_token_ids) for o in outs)
            p["accepted"] += sum(o.spec.num_accepted_tokens for o in outs)
            p["rounds"] += sum(o.spec.num_drafts for o in outs)
            p["drafts"] += sum(o.spec.num_draft_tokens for o in outs)
            p["outputs"] += [o.output_token_ids for o in outs]
    base = per["plain"]["tokens"] / per["plain"]["seconds"]
    chains = [per[n]["tokens"] / per[n]["seconds"] for n in names if "chain k=" in n]
    best = max(chains) if chains else base
    table = ["| contender | step | graphs | drafts / round | acceptance length | output tok/s | vs plain "
             "| vs best chain | differing |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    summary = {}
    for name in names:
        p = per[name]
        tps, al, diff = run_stats(p, per["plain"])
        dpr = p["drafts"] / p["rounds"] if p["rounds"] else 0.0
        summary[name] = dict(tok_s=round(tps, 2), vs_plain=round(tps / base, 3),
                             acceptance_length=round(al, 3),
                             drafts_per_round=round(dpr, 2), differing=diff)
        mode = "compiled" if args.compile else "eager"
        summary[name].update(step=mode, **built[name])
        summary[name]["vs_best_chain"] = round(tps / best, 3)
        choice = (llms[name].engine.draft_length.summary() or {}).get("tree_choice") if k_of(name) else None
        if choice:          # the automatic choice: steps that proposed the tree, exploring ones apart
            summary[name].update(tree_steps=choice["tree_steps"], explored_steps=choice["explored_steps"],
                                 planned_steps=choice["planned_steps"])
        table.append(f"| {name} | {mode} | {built[name]['graphs']} | {dpr:.1f} | {al:.2f} | {tps:.1f} "
                     f"| {tps / base:.2f}x | {tps / best:.2f}x | {diff} |")
    write_results(args, "trees", summary, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
