"""Compiled plain and auto alone on the first chunk of bench_speedup's concurrency-16 cell (GSM8K
test prompts 0, 4, 8, ...; 128 tokens), twice, auto forgetting what it learned between: where
auto's time goes against plain (prefill, verify, draft, the steps that draft, host).
usage: OMP_NUM_THREADS=1 MTPX_DATA_DIR=../shared/data python experiments/ragged_compiled/c16_chunk0.py"""
import collections
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
prompts = [format_prompt(r["question"])
           for r in load_gsm8k(os.path.join(os.environ.get("MTPX_DATA_DIR", "../shared/data"),
                                            "gsm8k/test.jsonl"))[:128]]
chunk = prompts[0::4]
llms = {n: LLM(model=str(ROOT / "checkpoints" / "demo"), spec=s, num_speculative_tokens=k, max_num_seqs=16,
               compile=True, max_model_len=1024)
        for n, s, k in (("plain", None, None), ("auto", "mtp8", "auto"))}
for rep in range(2):
    for n, llm in llms.items():
        llm.engine.reset_step_timings()
        t0 = time.perf_counter()
        llm.generate(chunk, SamplingParams(max_tokens=128), max_concurrency=16)
        wall = time.perf_counter() - t0
        ts = llm.engine.step_timings
        agg = collections.defaultdict(float)
        for t in ts:
            kind = "prefill" if t.num_prefill_tokens else "decode"
            agg[kind + "_n"] += 1
            agg["prefill_ms"] += 1e3 * t.prefill_s
            agg["verify_ms"] += 1e3 * t.verify_s
            agg["draft_ms"] += 1e3 * t.draft_s
            agg["k>0 steps"] += t.num_draft_tokens > 0
            agg["k>0 verify+draft ms"] += 1e3 * (t.verify_s + t.draft_s) * (t.num_draft_tokens > 0)
        fwd = agg["prefill_ms"] + agg["verify_ms"] + agg["draft_ms"]
        print(rep, n, "wall ms", round(1e3 * wall), "steps", len(ts), {k: round(v) for k, v in agg.items()},
              "host ms", round(1e3 * wall - fwd))
        if n == "auto":
            llm.engine.draft_length.reset()   # the second pass starts as the first
