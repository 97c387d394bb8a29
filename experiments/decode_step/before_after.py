"""Eager and compiled plain and mtp8 decoding of one mtpx checkout, for comparing two commits
(the experiments' one harness for that: decode_step/ and compile_time/vs_previous/ use it).

    python experiments/decode_step/before_after.py --root CHECKOUT --out FILE.json \
        [--modes eager compiled] [--c1-prompts 4] [--c64-prompts 64] [--max-tokens 128] [--threads 2]

Imports mtpx from --root (the same script measures the commit before the decode-step redesign
and the redesign), builds plain and mtp8 engines of the demo (max_num_seqs 64), eager and with
engine.compile, then for each mode, alternating plain and mtp8, decodes the first --c1-prompts
GSM8K test questions one at a time (concurrency 1) and --c64-prompts at once (concurrency 64),
greedy, at most --max-tokens each. Writes output tok/s per engine, mode and concurrency, the
build times and the tokens (to check both commits agree). run.sh alternates the two checkouts'
processes; summarize.py pairs them.
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--root", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--c1-prompts", type=int, default=4)
ap.add_argument("--c64-prompts", type=int, default=64)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
args = ap.parse_args()
sys.path.insert(0, args.root)

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

torch.set_num_threads(args.threads)
data = os.path.join(os.environ.get("MTPX_DATA_DIR", os.path.join(args.root, "..", "shared", "data")),
                    "gsm8k", "test.jsonl")
questions = [format_prompt(q["question"]) for q in load_gsm8k(data)[:max(args.c1_prompts, args.c64_prompts)]]
params = SamplingParams(max_tokens=args.max_tokens)
import inspect  # noqa: E402
# checkouts before LLM(threads=) set the threads above only
kw = {"threads": args.threads} if "threads" in inspect.signature(LLM.__init__).parameters else {}
rows, tokens, builds = [], {}, {}
for mode in args.modes:
    engines = {}
    for name, spec in (("plain", None), ("mtp8", "mtp8")):
        t0 = time.perf_counter()
        engines[name] = LLM(args.root + "/checkpoints/demo", spec=spec, compile=mode == "compiled",
                            max_num_seqs=64, **kw)
        builds[f"{name}-{mode}"] = round(time.perf_counter() - t0, 1)
        print(f"{name} {mode}: built in {builds[f'{name}-{mode}']} s", flush=True)
    for conc, n_prompts in ((1, args.c1_prompts), (64, args.c64_prompts)):
        for i, name in enumerate(("plain", "mtp8", "mtp8", "plain")):   # each twice, alternated
            t0 = time.perf_counter()
            outs = engines[name].generate(questions[:n_prompts], params, max_concurrency=conc)
            dt = time.perf_counter() - t0
            n = sum(len(o.output_token_ids) for o in outs)
            rows.append({"engine": name, "mode": mode, "concurrency": conc, "repeat": i // 2,
                         "tokens": n, "seconds": round(dt, 3), "tok_s": round(n / dt, 2)})
            tokens[f"{name}-{mode}-{conc}"] = [o.output_token_ids for o in outs]
            print(f"{mode} c={conc} {name}: {n / dt:.1f} tok/s", flush=True)
    del engines
with open(args.out, "w") as fh:
    json.dump({"root": args.root, "builds": builds, "rows": rows, "tokens": tokens,
               "threads": args.threads}, fh)
