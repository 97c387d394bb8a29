"""auto's prior acceptance, 0.7 against 0.8, at concurrency 64, beside plain decoding and fixed
k = 4, on one workload: `gsm8k` (the first CHUNKS x 64 GSM8K test prompts, formatted as the eval
formats them) or `builtin` (the main job's 64 built-in prompts, CHUNKS rounds of the same 64).
At most 128 tokens, greedy, eos ends a request, all 64 in flight. The engines generate every
chunk in an order rotated per chunk, in one process; both auto engines share one step-cost
calibration (the cache), so only the prior differs. Prints per chunk each engine's output tok/s
over plain's, then the median over chunks and the ratio over all chunks, and the k per step and
depths of each auto engine; tokens are compared with plain decoding's.

    OMP_NUM_THREADS=2 python experiments/auto_k/prior_ab.py gsm8k|builtin [CHUNKS]
"""
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MTPX_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402  (MTPX_DATA_DIR, else conf/config.yaml's data_dir)
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.data.prompts import load_prompts  # noqa: E402

torch.set_num_threads(2)
workload = sys.argv[1]
chunks = int(sys.argv[2]) if len(sys.argv) > 2 else 8
kw = dict(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=64, max_model_len=1024)
engines = {"plain": LLM(**kw), "mtp4": LLM(spec="mtp8", num_speculative_tokens=4, **kw)}
for prior in (0.7, 0.8):
    llm = LLM(spec="mtp8", num_speculative_tokens="auto", **kw)
    llm.engine.draft_length.prior_acceptance = prior
    llm.engine.draft_length.reset()
    engines[f"auto {prior}"] = llm
    print(f"auto {prior}: step costs {llm.calibration['source']} ({llm.calibration['seconds']:.1f} s)",
          flush=True)
if workload == "gsm8k":
    questions = load_gsm8k(data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl")
    work = [[format_prompt(r["question"]) for r in questions[c * 64:(c + 1) * 64]] for c in range(chunks)]
else:
    llm0 = engines["plain"]
    prompts = load_prompts({"name": "builtin", "prompt_tokens": 128}, 64, llm0.tokenizer,
                           llm0.model.cfg.vocab_size)
    work = [[p.engine_input for p in prompts]] * chunks
params = SamplingParams(max_tokens=128)
names = list(engines)
seconds = {n: [] for n in names}
tokens = {n: 0 for n in names}
mismatches = {n: 0 for n in names}
for c, chunk in enumerate(work):
    outs = {}
    for n in names[c % len(names):] + names[: c % len(names)]:
        t0 = time.perf_counter()
        outs[n] = engines[n].generate(chunk, params)
        seconds[n].append(time.perf_counter() - t0)
    for n in names:
        tokens[n] += sum(len(o.output_token_ids) for o in outs[n])
        mismatches[n] += sum(a.output_token_ids != b.output_token_ids for a, b in zip(outs[n], outs["plain"]))
    print(f"chunk {c}: " + ", ".join(f"{n} {seconds['plain'][-1] / seconds[n][-1]:.2f}x" for n in names[1:]),
          flush=True)
print(f"\n{workload}, concurrency 64, {chunks} chunks: output tok/s over plain decoding's")
for n in names[1:]:
    r = [p / s for p, s in zip(seconds["plain"], seconds[n])]
    overall = (tokens[n] / sum(seconds[n])) / (tokens["plain"] / sum(seconds["plain"]))
    print(f"  {n}: median over chunks {statistics.median(r):.2f}x (min-max {min(r):.2f}-{max(r):.2f}), "
          f"over all chunks {overall:.2f}x, requests differing from plain {mismatches[n]}")
for n in names[2:]:
    policy = engines[n].engine.draft_length
    print(f"  {n}: k per step {dict(sorted(policy.histogram.items()))}, depths given "
          f"{dict(sorted(policy.depth_histogram.items()))}")
