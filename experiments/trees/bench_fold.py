"""mtp8 tree drafting with each module run once per step (`_fold`, the default) against two forwards
per module (the catch-up, then the nodes: `mtpx.spec_decode.tree_draft.use_fold = False`, the cost of
drafting before), with the mtp8 chain and plain decoding, contenders alternated in one process.

    python experiments/trees/bench_fold.py [--data gsm8k|humaneval] [--num-prompts 16] \
        [--max-tokens 64] [--rounds 4] [--out DIR]

Greedy, eager, concurrency 1, the demo checkpoint, one thread. Per contender: output tok/s over all
chunks, its ratio to the chain, acceptance length, and requests differing from plain decoding.
Writes fold.json and fold.md into --out.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_trees import MTP8_SMALL, MTP8_TREE, load_prompts, run_stats, write_results  # noqa: E402
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.spec_decode import tree_draft  # noqa: E402

SPECS = {"plain": (None, None), "mtp8 chain k=8": (8, None), "mtp8 tree chain8+1 (9)": (None, MTP8_SMALL),
         "mtp8 tree [2,1x7]": (None, [2] + [1] * 7), "mtp8 tree preset (12)": (None, MTP8_TREE)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--data", choices=["gsm8k", "humaneval"], default="gsm8k")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="/tmp/bench_fold")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    prompts = load_prompts(args.data, args.num_prompts)
    chunks = [prompts[i:: args.rounds] for i in range(args.rounds)]
    params = SamplingParams(max_tokens=args.max_tokens)
    llms = {name: LLM(model=args.model, spec=None if name == "plain" else "mtp8", num_speculative_tokens=k,
                      tree=tree, max_num_seqs=1, compile=False, max_model_len=1024)
            for name, (k, tree) in SPECS.items()}
    runs = [(name, True) for name in SPECS]
    runs += [(name, False) for name, (_, tree) in SPECS.items() if tree is not None]
    per = {r: {"tokens": 0, "seconds": 0.0, "accepted": 0, "rounds": 0, "outputs": []} for r in runs}
    for c, chunk in enumerate(chunks):
        for run in runs[c % len(runs):] + runs[: c % len(runs)]:
            tree_draft.use_fold = run[1]
            t0 = time.perf_counter()
            outs = llms[run[0]].generate(chunk, params)
            p = per[run]
            p["seconds"] += time.perf_counter() - t0
            p["tokens"] += sum(len(o.output_token_ids) for o in outs)
            p["accepted"] += sum(o.spec.num_accepted_tokens for o in outs)
            p["rounds"] += sum(o.spec.num_drafts for o in outs)
            p["outputs"] += [o.output_token_ids for o in outs]
    tree_draft.use_fold = True
    chain = per[("mtp8 chain k=8", True)]
    chain_tps = chain["tokens"] / chain["seconds"]
    table = ["| contender | mtp8 tree drafting | acceptance length | output tok/s | vs chain | differing |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    summary = []
    for run in runs:
        tps, al, diff = run_stats(per[run], per[("plain", True)])
        mode = "-" if SPECS[run[0]][1] is None else "one forward per module" if run[1] else "two forwards"
        summary.append(dict(contender=run[0], drafting=mode, tok_s=round(tps, 2),
                            vs_chain=round(tps / chain_tps, 3), acceptance_length=round(al, 3),
                            differing=diff))
        table.append(f"| {run[0]} | {mode} | {al:.2f} | {tps:.1f} | {tps / chain_tps:.2f}x | {diff} |")
    write_results(args, "fold", summary, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
