"""Greedy tokens of plain and mtp8 (prefix caching) on the first 128 GSM8K test questions, 128
tokens, concurrency 64, 1 thread, written as JSON to compare two commits (experiments/prefill).

    MTPX_DATA_DIR=../shared/data OMP_NUM_THREADS=1 python experiments/prefill/same_tokens.py OUT.json
"""
import sys
import json
import time
import torch
sys.path.insert(0, '.')
from mtpx import LLM, SamplingParams
from mtpx.schema import data_dir
from pathlib import Path
from mtpx.data.gsm8k import format_prompt, load_gsm8k
torch.set_num_threads(1)
prompts = [format_prompt(r["question"])
           for r in load_gsm8k(data_dir(Path("conf")) / "gsm8k" / "test.jsonl")[:128]]
out = {}
for spec in (None, "mtp8"):
    llm = LLM("checkpoints/demo", spec=spec, max_num_seqs=64, enable_prefix_caching=(spec == "mtp8"))
    t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=128, temperature=0), max_concurrency=64)
    out[str(spec)] = [o.outputs[0].token_ids for o in outs]
    print(spec, f"{time.perf_counter() - t:.1f} s", file=sys.stderr)
json.dump(out, open(sys.argv[1], "w"))
