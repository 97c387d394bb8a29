"""Compiled plain and mtp8 decoding of one mtpx checkout, for comparing two commits side by side.

    python experiments/compile_time/vs_previous.py --root CHECKOUT --out FILE.json \
        [--prompts 16] [--max-tokens 128] [--repeats 2] [--threads 2]

Imports mtpx from --root (so the same script measures the previous commit's engine and this
one's), builds compiled plain and mtp8 engines of the demo (max_num_seqs 64), then, --repeats
times and alternating the engines, decodes the first --prompts GSM8K test questions one at a
time (concurrency 1) and 64 questions at once (concurrency 64), greedy, --max-tokens each.
Writes output tok/s per engine, concurrency and repeat, the build times and the tokens (to check
the two commits agree). run.sh alternates the two checkouts' processes.
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--root", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--prompts", type=int, default=16)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--repeats", type=int, default=2)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
sys.path.insert(0, args.root)

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

torch.set_num_threads(args.threads)
data = os.path.join(os.environ.get("MTPX_DATA_DIR", os.path.join(args.root, "..", "shared", "data")),
                    "gsm8k", "test.jsonl")
questions = [format_prompt(q["question"]) for q in load_gsm8k(data)[:64]]
params = SamplingParams(max_tokens=args.max_tokens)
import inspect  # noqa: E402
kw = {"threads": args.threads} if "threads" in inspect.signature(LLM.__init__).parameters else {}
engines, builds = {}, {}
for name, spec in (("plain", None), ("mtp8", "mtp8")):
    t0 = time.perf_counter()
    engines[name] = LLM(args.root + "/checkpoints/demo", spec=spec, compile=True, max_num_seqs=64, **kw)
    builds[name] = round(time.perf_counter() - t0, 1)
    print(f"{name}: built in {builds[name]} s", flush=True)

rows, tokens = [], {}
for r in range(args.repeats):
    for conc in (1, 64):
        for name in (("plain", "mtp8") if r % 2 == 0 else ("mtp8", "plain")):
            llm = engines[name]
            t0 = time.perf_counter()
            batch = questions[:args.prompts] if conc == 1 else questions
            outs = llm.generate(batch, params, max_concurrency=conc)
            dt = time.perf_counter() - t0
            n = sum(len(o.output_token_ids) for o in outs)
            rows.append({"engine": name, "concurrency": conc, "repeat": r, "tokens": n,
                         "seconds": round(dt, 3), "tok_s": round(n / dt, 2)})
            tokens[f"{name}-{conc}"] = [o.output_token_ids for o in outs]
            print(f"repeat {r} c={conc} {name}: {n / dt:.1f} tok/s", flush=True)
with open(args.out, "w") as fh:
    json.dump({"root": args.root, "builds": builds, "rows": rows, "tokens": tokens,
               "threads": args.threads}, fh)
