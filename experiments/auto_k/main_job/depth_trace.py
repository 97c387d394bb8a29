"""num_speculative_tokens=auto on the main job's workload (64 built-in prompts, greedy, at most 128
tokens, all in flight), two rounds: every depth given at admission or lowered, with the
acceptance estimates it was decided from. Step costs from the step-cost cache.

    OMP_NUM_THREADS=2 python experiments/auto_k/main_job/depth_trace.py
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.prompts import load_prompts  # noqa: E402

torch.set_num_threads(2)
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
          max_num_seqs=64)
policy = llm.engine.draft_length
prompts = load_prompts({"name": "builtin", "prompt_tokens": 128}, 64, llm.tokenizer, llm.model.cfg.vocab_size)
depth = policy.depth
last = None


def traced(batch_size, current=None):
    global last
    d = depth(batch_size, current)
    line = (f"  depth(B={batch_size}, current={current}) -> {d}; k in use {policy.k}; "
            f"p = {[round(x, 2) for x in policy.acceptance]}")
    if (current is None or d != current) and line != last:
        print(line + f"; decode steps so far {sum(policy.histogram.values())}")
        last = line
    return d


policy.depth = traced
for r in range(2):
    llm.generate([p.engine_input for p in prompts], SamplingParams(max_tokens=128))
    s = policy.summary()
    print(f"round {r}: k per decode step {s['k_histogram']}, depth per request {s['depth_histogram']}")
