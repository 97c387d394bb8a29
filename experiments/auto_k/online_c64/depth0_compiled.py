"""Compiled automatic k held at k = 0 against compiled plain decoding at batch 64: does a depth-0
automatic-k engine decode as fast as plain decoding? 64 GSM8K test questions, at most 64 tokens,
1 thread, the two engines alternated over 3 rounds.

    python experiments/auto_k/online_c64/depth0_compiled.py
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.schema import CONF_DIR, data_dir  # noqa: E402

torch.set_num_threads(1)
questions = [format_prompt(q["question"])
             for q in load_gsm8k(data_dir(CONF_DIR) / "gsm8k" / "test.jsonl")[:64]]
params = SamplingParams(max_tokens=64)
engines = {"plain": LLM("checkpoints/demo", max_num_seqs=64, compile=True, max_model_len=1024),
           "auto": LLM("checkpoints/demo", spec="mtp8", num_speculative_tokens="auto", max_num_seqs=64,
                       compile=True, max_model_len=1024)}
engines["auto"].engine.draft_length.forced = 0          # k = 0 in every step
for llm in engines.values():
    llm.generate(questions[:8], SamplingParams(max_tokens=4))
speeds = {"plain": [], "auto": []}
for r in range(3):
    for name in ("plain", "auto") if r % 2 == 0 else ("auto", "plain"):
        t0 = time.perf_counter()
        outs = engines[name].generate(questions, params)
        speeds[name].append(sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - t0))
        print(f"round {r} {name}: {speeds[name][-1]:.1f} tok/s", flush=True)
print("auto / plain per round:", [round(a / p, 3) for a, p in zip(speeds["auto"], speeds["plain"])])
