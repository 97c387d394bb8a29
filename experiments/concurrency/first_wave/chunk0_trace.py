"""The first chunk of bench_speedup's compiled concurrency-16 cell (32 GSM8K test prompts, 128
tokens) on automatic k after a policy reset, twice: wall s, forward s by kind of step, the depth
histogram, and the steps that drafted, held a depth or prefilled, run-length encoded as
(k, deepest depth, decodes, prefills) x steps: ms a step. VARIANT new (the default rules) or old
(`patient_start`, `free_landing_lead` 0: before 2026-12-06). COSTS: a step-cost file.
usage: OMP_NUM_THREADS=1 MTPX_DATA_DIR=../shared/data \
    python experiments/concurrency/first_wave/chunk0_trace.py COSTS VARIANT"""
import collections
import os
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
costs, variant = sys.argv[1], sys.argv[2]
auto = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
           max_num_seqs=16, max_model_len=1024, compile=True, cost_model_file=costs)
policy = auto.engine.draft_length
if variant == "old":
    policy.patient_start, policy.free_landing_lead = True, 0.0
trace = []
scheduler = auto.engine.scheduler
update = scheduler.update_from_output


def traced(out, result):
    t = result.timing
    if t is not None:
        held = max([out.num_speculative_tokens] + [d.request.draft_depth for d in out.decodes])
        trace.append(((out.num_speculative_tokens, held, len(out.decodes), len(out.prefills)),
                      t.prefill_s + t.verify_s + t.draft_s))
    return update(out, result)


scheduler.update_from_output = traced
for rep in range(2):
    policy.reset()
    trace.clear()
    t0 = time.perf_counter()
    auto.generate(prompts, SamplingParams(max_tokens=128), max_concurrency=16)
    wall = time.perf_counter() - t0
    runs = []
    for key, s in trace:
        if runs and runs[-1][0] == key:
            runs[-1][1] += 1
            runs[-1][2] += s
        else:
            runs.append([key, 1, s])
    kinds = collections.defaultdict(float)
    for (k, held, _, prefills), s in trace:
        kinds["prefill" if prefills else f"k{k} held {held}"] += s
    print(f"{variant} {rep}: wall {wall:.2f} s, forwards {sum(s for _, s in trace):.2f} s "
          f"{ {k: round(v, 2) for k, v in sorted(kinds.items())} }, depths "
          f"{dict(sorted(policy.depth_histogram.items()))}")
    print("   ", " ".join(f"{key}x{n}:{1e3 * s / n:.0f}ms" for key, n, s in runs if key[0] or key[1]
                          or key[3]), flush=True)
