"""Where the eager prefill of the first 64 GSM8K test prompts goes (plain engine, demo, 1 thread).

    OMP_NUM_THREADS=1 python experiments/prefill/profile_prefill.py [--profile]
"""
import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--profile", action="store_true")
ap.add_argument("--num-prompts", type=int, default=64)
ap.add_argument("--repeats", type=int, default=3)
args = ap.parse_args()
torch.set_num_threads(1)
prompts = [format_prompt(r["question"])
           for r in load_gsm8k(data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl")[: args.num_prompts]]
llm = LLM(str(ROOT / "checkpoints/demo"), max_num_seqs=64)
params = SamplingParams(max_tokens=1, temperature=0)
llm.generate(prompts[:4], params)
times = []
for _ in range(args.repeats):
    t = time.perf_counter()
    llm.generate(prompts, params, max_concurrency=64)
    times.append(time.perf_counter() - t)
print("prefill of", len(prompts), "prompts:", " ".join(f"{x:.2f}" for x in times), "s")
if args.profile:
    from torch.profiler import profile
    with profile() as prof:
        llm.generate(prompts, params, max_concurrency=64)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
