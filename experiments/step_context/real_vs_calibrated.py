"""Is the engine's real decode step at concurrency 64 the step the calibration times?

Runs plain decoding (and, with --spec, a fixed k) on the first 64 GSM8K test questions at
concurrency 64 and prints the median pure-decode step (verify + draft, ms) at the batch sizes
seen, with the batch's mean and largest context; then times the same engine's decode step
(Engine.time_decode_steps, as automatic k's calibration does) at batch 64 for contexts 192 and
the real run's mean and largest. Usage (1 thread, nothing else running):

    MTPX_DATA_DIR=../shared/data python experiments/step_context/real_vs_calibrated.py [--k 1]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--k", type=int, default=0, help="0: plain; else multi-module MTP (mtp8) with this k")
ap.add_argument("--num-prompts", type=int, default=64)
args = ap.parse_args()
torch.set_num_threads(1)
prompts = [format_prompt(r["question"])
           for r in load_gsm8k(data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl")[: args.num_prompts]]
spec = None if args.k == 0 else "mtp8"
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec=spec, num_speculative_tokens=args.k or None,
          max_num_seqs=64, max_model_len=1024)
eng = llm.engine
lens = [len(llm.tokenizer.encode(p)) for p in prompts]
print(f"prompt tokens: mean {statistics.mean(lens):.0f}, max {max(lens)}")
params = SamplingParams(max_tokens=128)
llm.generate(prompts[:8], params, max_concurrency=64)     # warm
eng.reset_step_timings()
t0 = time.perf_counter()
outs = llm.generate(prompts, params, max_concurrency=64)
dt = time.perf_counter() - t0
n = sum(len(o.output_token_ids) for o in outs)
print(f"run: {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s")
by_b = {}
for t in eng.step_timings:
    if t.num_decodes and not t.num_prefill_tokens:
        by_b.setdefault(t.num_decodes, []).append(1e3 * (t.verify_s + t.draft_s))
for b in sorted(by_b):
    if b in (64, 63, 62, 60, 48, 32, 16):
        print(f"real: B={b} steps={len(by_b[b])} median {statistics.median(by_b[b]):.1f} ms")
mean_ctx = int(statistics.mean(lens) + 64)
max_ctx = int(max(lens) + 128)
for ctx in (192, mean_ctx, max_ctx):
    ms = eng.time_decode_steps(64, [args.k], ctx, rounds=5)[args.k]
    print(f"calibration-style: B=64 k={args.k} context {ctx}: median {statistics.median(ms):.1f} ms "
          f"({min(ms):.1f}-{max(ms):.1f})")
