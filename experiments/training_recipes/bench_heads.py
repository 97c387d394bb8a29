"""Output tok/s of trained heads beside the shipped ones, alternated in one run (concurrency 1).

    /work/bench1 python experiments/training_recipes/bench_heads.py --compile --num-prompts 8 \\
        --max-tokens 128 --rounds 4 --out /tmp/mtpx_recipes3/bench \\
        plain=checkpoints/demo shipped:mtp8=checkpoints/demo lk:mtp8=/tmp/mtpx_recipes3/ft_lk

Each contender is NAME[:SPEC[:K]]=CHECKPOINT (SPEC mtp1 | mtp8, K its num_speculative_tokens; no
SPEC: plain decoding). One LLM per contender (compiled and warmed up before anything is timed
with --compile), greedy, max_num_seqs 1. The first --num-prompts GSM8K test questions are cut
into --rounds chunks; every contender generates each chunk, in an order rotated per chunk.
tok/s = output tokens / generate wall time over all chunks; the spread is the min-max of the
per-chunk tok/s. Greedy output must equal the first contender's (counted). Writes bench.json and
bench.md into --out.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402
from mtpx.metrics.stats import aggregate_spec  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402


def parse(spec: str) -> tuple[str, str | None, int | None, str]:
    """NAME[:SPEC[:K]]=CHECKPOINT -> (name, spec, k, checkpoint)."""
    head, _, path = spec.partition("=")
    name, *rest = head.split(":")
    k = int(rest[1]) if len(rest) > 1 else ({"mtp1": 1, "mtp8": 8}.get(rest[0]) if rest else None)
    return name, (rest[0] if rest else None), k, path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("contenders", nargs="+")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    gsm8k = data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl"   # MTPX_DATA_DIR or conf/config.yaml data_dir
    prompts = [format_prompt(r["question"]) for r in load_gsm8k(str(gsm8k))[: args.num_prompts]]
    chunks = [prompts[i:: args.rounds] for i in range(args.rounds)]
    params = SamplingParams(max_tokens=args.max_tokens)
    cons = [parse(c) for c in args.contenders]
    llms = {}
    for name, spec, k, path in cons:
        t0 = time.perf_counter()
        llms[name] = LLM(model=path, spec=spec, num_speculative_tokens=k, max_num_seqs=1,
                         compile=args.compile, max_model_len=1024)
        print(f"{name}: ready in {time.perf_counter() - t0:.1f} s", flush=True)
    per = {c[0]: {"tokens": 0, "seconds": 0.0, "chunk_tok_s": [], "outputs": []} for c in cons}
    for c, chunk in enumerate(chunks):
        names = [x[0] for x in cons]
        for name in names[c % len(names):] + names[: c % len(names)]:
            t0 = time.perf_counter()
            outs = llms[name].generate(chunk, params, max_concurrency=1)
            dt = time.perf_counter() - t0
            n = sum(len(o.output_token_ids) for o in outs)
            p = per[name]
            p["tokens"] += n
            p["seconds"] += dt
            p["chunk_tok_s"].append(n / dt)
            p["outputs"].extend(outs)
            print(f"chunk {c}: {name} {n / dt:.1f} tok/s", flush=True)
    first = [o.output_token_ids for o in per[cons[0][0]]["outputs"]]
    rows = []
    for name, spec, k, path in cons:
        p = per[name]
        s = aggregate_spec(p["outputs"]) if spec else None
        rows.append({"contender": name, "checkpoint": path, "spec": spec, "k": k,
                     "output_tok_s": p["tokens"] / p["seconds"], "chunk_min": min(p["chunk_tok_s"]),
                     "chunk_max": max(p["chunk_tok_s"]), "output_tokens": p["tokens"],
                     "acceptance_length": None if s is None else s.acceptance_length,
                     "differ_from_first": sum(o.output_token_ids != f for o, f in zip(p["outputs"], first))})
    lines = [f"Output tok/s, {args.num_prompts} GSM8K test prompts in {args.rounds} alternated chunks, "
             f"concurrency 1, max {args.max_tokens} tokens, {'compiled' if args.compile else 'eager'}, "
             f"1 thread, {platform.processor() or platform.machine()}", "",
             "| contender | spec | output tok/s | chunk min-max | acceptance length | requests differing |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        al = "-" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}"
        spec = "plain" if not r["spec"] else f"{r['spec']} k={r['k']}"
        lines.append(f"| {r['contender']} | {spec} | "
                     f"{r['output_tok_s']:.1f} | {r['chunk_min']:.1f}-{r['chunk_max']:.1f} | {al} | "
                     f"{r['differ_from_first']} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "bench.json", rows)
    atomic_write_text(out / "bench.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
