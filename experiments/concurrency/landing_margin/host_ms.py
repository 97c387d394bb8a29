"""Host ms per engine step beyond its forwards (wall minus StepTiming prefill/verify/draft), plain
vs auto (num_speculative_tokens=auto), eager, 32 GSM8K test prompts, 128 tokens, 1 thread, 3 rounds
alternated after a warm-up. usage: python host_ms.py checkpoints/demo CONCURRENCY"""
import os
import sys
import time

import torch

from mtpx import LLM, SamplingParams
from mtpx.data.gsm8k import format_prompt, load_gsm8k

torch.set_num_threads(1)
model, conc = sys.argv[1], int(sys.argv[2])
prompts = [format_prompt(r["question"])
           for r in load_gsm8k(os.path.join(os.environ.get("MTPX_DATA_DIR", "../shared/data"),
                                            "gsm8k/test.jsonl"))[:32]]
params = SamplingParams(max_tokens=128)
llms = {name: LLM(model=model, spec=spec, num_speculative_tokens=k, max_num_seqs=conc, max_model_len=1024)
        for name, spec, k in (("plain", None, None), ("auto", "mtp8", "auto"))}
for llm in llms.values():
    llm.generate(prompts[:8], params, max_concurrency=conc)
res = {n: [] for n in llms}
for _ in range(3):
    for name, llm in llms.items():
        llm.engine.reset_step_timings()
        t0 = time.perf_counter()
        llm.generate(prompts, params, max_concurrency=conc)
        wall = time.perf_counter() - t0
        ts = llm.engine.step_timings
        fwd = sum(t.prefill_s + t.verify_s + t.draft_s for t in ts)
        res[name].append(1e3 * (wall - fwd) / len(ts))
for n, v in res.items():
    print(n, "host ms a step:", [round(x, 3) for x in v])
