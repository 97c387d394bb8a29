"""Compiled concurrency 16 as bench_speedup's cell runs it (128 GSM8K test prompts, 128 tokens,
4 chunks of 32, each two waves of 16; the engines alternated per chunk, their policies kept
across chunks): plain decoding against automatic k under each VARIANT, an `admission_landing`
(request: an admission's landing priced with its own prefill, so a wave splits by prompt length;
batch: on the batch's goodputs without it, alike for every prompt; off: no landing at admission),
"-noexplore" appended for explore_budget 0; all loading the step costs COSTS (one whose upper
estimates make k = 4 worth testing at batch 16). Twice, fresh policies. Prints each chunk's
tok/s, each pass's ratios and depth histograms.
usage: OMP_NUM_THREADS=1 MTPX_DATA_DIR=../shared/data \
    python experiments/concurrency/draft_costs/landing_ab.py COSTS [VARIANT ...]
(default: request batch off; explore_ab.log: batch batch-noexplore)"""
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

prompts = [format_prompt(r["question"]) for r in load_gsm8k(
    os.path.join(os.environ.get("MTPX_DATA_DIR", "../shared/data"), "gsm8k/test.jsonl"))[:128]]
chunks = [prompts[i::4] for i in range(4)]
model = str(ROOT / "checkpoints" / "demo")
names = ["plain"] + (sys.argv[2:] or ["request", "batch", "off"])
llms = {"plain": LLM(model=model, max_num_seqs=16, compile=True, max_model_len=1024)}
for name in names[1:]:
    llms[name] = LLM(model=model, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=16, compile=True,
                     max_model_len=1024, cost_model_file=sys.argv[1])
    mode, *tails = name.split("-")
    pol = llms[name].engine.draft_length
    pol.admission_landing = mode
    if "noexplore" in tails:
        pol.explore_budget = 0.0
    if "old" in tails:        # before 2026-12-06's first-wave rules: a patient start, landings free
        pol.patient_start, pol.free_landing_lead = True, 0.0
    if "freeland" in tails:   # the start falls at once, but a landing on upper estimates is free
        pol.free_landing_lead = 0.0
params = SamplingParams(max_tokens=128)
for rep in range(2):
    for name in names[1:]:
        llms[name].engine.draft_length.reset()
        llms[name].engine.draft_length.reset_histograms()
    tok = {n: [] for n in names}
    for c, chunk in enumerate(chunks):
        for name in names[c % len(names):] + names[:c % len(names)]:
            t0 = time.perf_counter()
            outs = llms[name].generate(chunk, params, max_concurrency=16)
            tok[name].append(sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - t0))
            print(f"pass {rep} chunk {c}: {name} {tok[name][-1]:.1f} tok/s", flush=True)
    for name in names[1:]:
        pol = llms[name].engine.draft_length
        ratios = [a / b for a, b in zip(tok[name], tok["plain"])]
        total = len(chunks) / sum(1 / t for t in tok[name]) / (len(chunks) / sum(1 / t for t in tok["plain"]))
        print(f"pass {rep} {name}: {total:.3f}x plain (chunks {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"paired median {statistics.median(ratios):.3f}); "
              f"depths {dict(sorted(pol.depth_histogram.items()))}, "
              f"k {dict(sorted(pol.histogram.items()))}", flush=True)
