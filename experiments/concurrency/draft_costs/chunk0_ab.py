"""The first chunk of bench_speedup's compiled concurrency-16 cell (32 GSM8K test prompts, 128
tokens; two waves of 16): plain decoding against automatic k loading the step costs COSTS under
each `admission_landing` (request, batch, off: AutoDraftLength), the estimates reset before every
run; alternated, 3 rounds: wall s, depth histogram, prefill steps, decode steps and the steps
that verified drafts. DRAFT_SHARE=x prices an unmeasured draft round at x (t(k) - t(0)) (the
stand-in for the calibrated draft rounds that `chunk0_draft_share.log` ran with; without it, and
with COSTS lacking draft_costs, the old t(k) - t(0): `chunk0_before.log`). Ran on 8cd0838's
parent tree plus the admission_landing switch (the draft costs not yet calibrated).
usage: OMP_NUM_THREADS=1 MTPX_DATA_DIR=../shared/data \
    python experiments/concurrency/draft_costs/chunk0_ab.py COSTS"""
import collections
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
    os.path.join(os.environ.get("MTPX_DATA_DIR", "../shared/data"), "gsm8k/test.jsonl"))[:128]][0::4]
model = str(ROOT / "checkpoints" / "demo")
plain = LLM(model=model, max_num_seqs=16, compile=True, max_model_len=1024)
auto = LLM(model=model, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=16, compile=True,
           max_model_len=1024, cost_model_file=sys.argv[1])
policy = auto.engine.draft_length
if os.environ.get("DRAFT_SHARE"):
    share = float(os.environ["DRAFT_SHARE"])
    orig = policy.draft_cost

    def draft_cost(k, batch_size, per_module=None):
        per_module = policy._draft_per_module(batch_size) if per_module is None else per_module
        if k <= 0 or per_module:
            return orig(k, batch_size, per_module)
        return share * max(0.0, policy.calibrated_cost(k, batch_size) - policy.calibrated_cost(0, batch_size))
    policy.draft_cost = draft_cost
names = ["plain", "request", "batch", "off"]
wall = collections.defaultdict(list)
for rep in range(3):
    for name in names[rep % 4:] + names[:rep % 4]:
        llm = plain if name == "plain" else auto
        if name != "plain":
            policy.reset()
            policy.admission_landing = name
        llm.engine.reset_step_timings()
        t0 = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=128), max_concurrency=16)
        wall[name].append(time.perf_counter() - t0)
        hist = dict(sorted(policy.depth_histogram.items())) if name != "plain" else ""
        ts = llm.engine.step_timings
        pre = [t for t in ts if t.num_prefill_tokens]
        dec = [t for t in ts if not t.num_prefill_tokens]
        drafting = [t for t in dec if t.num_draft_tokens]
        print(rep, name, f"{wall[name][-1]:.2f} s", hist,
              f"prefill {len(pre)} steps {sum(t.prefill_s for t in pre):.2f} s;",
              f"decode {len(dec)} steps, all steps' verify + draft "
              f"{sum(t.verify_s + t.draft_s for t in ts):.2f} s, "
              f"drafting {len(drafting)} steps {sum(t.verify_s + t.draft_s for t in drafting):.2f} s; "
              f"draft s {sum(t.draft_s for t in dec):.2f}", flush=True)
for name in names:
    print(f"{name}: {statistics.median(wall[name]):.2f} s ({min(wall[name]):.2f}-{max(wall[name]):.2f}), "
          f"{statistics.median(wall['plain']) / statistics.median(wall[name]):.3f}x plain")
