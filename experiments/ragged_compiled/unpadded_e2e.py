"""End to end: the first chunk of bench_speedup's concurrency-16 cell (32 GSM8K test prompts, 128
tokens) compiled, plain decoding and mtp4, with batches unpadded (the CPU's default) against
padded to capture sizes, alternated in one process, 4 pairs after 1: wall seconds.
usage: OMP_NUM_THREADS=1 MTPX_DATA_DIR=../shared/data python experiments/ragged_compiled/unpadded_e2e.py"""
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.engine.decode_step import capture_sizes  # noqa: E402

prompts = [format_prompt(r["question"]) for r in load_gsm8k(
    os.path.join(os.environ.get("MTPX_DATA_DIR", "../shared/data"), "gsm8k/test.jsonl"))[:128]][0::4]
for spec, k in ((None, None), ("mtp8", 4)):
    llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec=spec, num_speculative_tokens=k, max_num_seqs=16,
              compile=True, max_model_len=1024)
    comp, wall = llm.engine.compiled, {"unpadded": [], "padded": []}
    for i in range(5):
        for name in (("unpadded", "padded") if i % 2 else ("padded", "unpadded")):
            comp.sizes = None if name == "unpadded" else capture_sizes(16)
            t0 = time.perf_counter()
            llm.generate(prompts, SamplingParams(max_tokens=128), max_concurrency=16)
            if i:
                wall[name].append(time.perf_counter() - t0)
    ratios = [a / b for a, b in zip(wall["unpadded"], wall["padded"])]
    print(spec or "plain", "unpadded", [round(x, 2) for x in wall["unpadded"]], "padded",
          [round(x, 2) for x in wall["padded"]],
          "paired median %.3f (%.3f-%.3f)" % (statistics.median(ratios), min(ratios), max(ratios)),
          flush=True)
