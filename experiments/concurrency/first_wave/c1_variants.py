"""Compiled concurrency 1, 32 GSM8K test prompts (every 4th of the first 128), 128 tokens, after a
policy reset, under each rule: now (the defaults), patient (`patient_start`), freeland
(`free_landing_lead` 0: every landing free) and both (the rules before 8540cb5); wall s, depth
and k histograms. The step costs: the step-cost cache's (calibrated on the first run).
usage: OMP_NUM_THREADS=1 MTPX_DATA_DIR=../shared/data \
    python experiments/concurrency/first_wave/c1_variants.py"""
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
auto = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
           max_num_seqs=1, max_model_len=1024, compile=True)
policy = auto.engine.draft_length
for variant in ("now", "patient", "patient+freeland", "freeland"):
    policy.patient_start = "patient" in variant
    policy.free_landing_lead = 0.0 if "freeland" in variant else 0.1
    policy.reset()
    policy.reset_histograms()
    t0 = time.perf_counter()
    auto.generate(prompts, SamplingParams(max_tokens=128), max_concurrency=1)
    print(variant, f"{time.perf_counter() - t0:.1f} s", "depths",
          dict(sorted(policy.depth_histogram.items())),
          "k", dict(sorted(policy.histogram.items())), flush=True)
