"""Gated DeltaNet prefills in mtpx's C window kernel (`deltanet._kernel_recurrence`) against the
torch forms before it (the chunked form, or the recurrent one up to 16 tokens), alternated in one
process by `deltanet.use_prefill_kernel`: (1) one request's prefill (eager, the engine's path for
one admission), median of 15 pairs; (2) the packed prefill of the first 16 and 64 GSM8K test
prompts (max_tokens 1), 5 pairs; (3) the first chunk of bench_speedup's compiled concurrency-16
cell (32 prompts, 128 tokens): plain, mtp4 and auto (mtp8), 3 pairs, the chunk's wall and its
prefill steps' seconds.
usage: OMP_NUM_THREADS=1 MTPX_DATA_DIR=../shared/data python experiments/prefill/kernel/ab.py"""
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)
import mtpx.models.deltanet as deltanet  # noqa: E402
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402


def use(name):
    deltanet.use_prefill_kernel = name == "kernel"


def prefill_s(llm):
    return sum(t.prefill_s for t in llm.engine.step_timings)


def paired(res):
    r = [a / b for a, b in zip(res["kernel"], res["torch"])]
    return f"{statistics.median(res['kernel']):.1f} / {statistics.median(res['torch']):.1f} ms, " \
           f"paired {statistics.median(r):.3f}x ({min(r):.3f}-{max(r):.3f})"


model = str(ROOT / "checkpoints" / "demo")
llm = LLM(model=model, max_num_seqs=64, max_model_len=1024)
g = torch.Generator().manual_seed(0)
print("one-request prefill, eager, kernel / torch forms")
for n in (8, 24, 40, 95, 150, 300, 900):
    ms = {"kernel": [], "torch": []}
    for i in range(17):
        p = torch.randint(2, 2000, (n,), generator=g).tolist()
        for name in (("kernel", "torch") if i % 2 else ("torch", "kernel")):
            use(name)
            llm.engine.reset_step_timings()
            llm.generate([p], SamplingParams(max_tokens=1, ignore_eos=True))
            if i >= 2:
                ms[name].append(1e3 * prefill_s(llm))
    print(f"  n={n}: {paired(ms)}", flush=True)
prompts = [format_prompt(r["question"]) for r in load_gsm8k(
    os.path.join(os.environ.get("MTPX_DATA_DIR", "../shared/data"), "gsm8k/test.jsonl"))[:128]]
print("packed prefill of the first GSM8K test prompts (max_tokens 1), eager, kernel / torch forms")
for n in (16, 64):
    ms = {"kernel": [], "torch": []}
    for i in range(6):
        for name in (("kernel", "torch") if i % 2 else ("torch", "kernel")):
            use(name)
            llm.engine.reset_step_timings()
            llm.generate(prompts[:n], SamplingParams(max_tokens=1), max_concurrency=64)
            if i >= 1:
                ms[name].append(1e3 * prefill_s(llm))
    print(f"  {n} prompts: {paired(ms)}", flush=True)
chunk = prompts[0::4]
for label, spec, k in (("plain", None, None), ("mtp4", "mtp8", 4), ("auto", "mtp8", "auto")):
    eng = LLM(model=model, spec=spec, num_speculative_tokens=k, max_num_seqs=16, compile=True,
              max_model_len=1024)
    res = {"kernel": [], "torch": []}
    for i in range(4):
        for name in (("kernel", "torch") if i % 2 else ("torch", "kernel")):
            use(name)
            if k == "auto":
                eng.engine.draft_length.reset()
            eng.engine.reset_step_timings()
            t0 = time.perf_counter()
            eng.generate(chunk, SamplingParams(max_tokens=128), max_concurrency=16)
            wall = time.perf_counter() - t0
            if i >= 1:
                res[name].append((wall, prefill_s(eng)))
    r = [a[0] / b[0] for a, b in zip(res["kernel"], res["torch"])]
    print(f"compiled c16 chunk 0, {label}: wall {[round(w, 2) for w, _ in res['kernel']]} s (kernel) vs "
          f"{[round(w, 2) for w, _ in res['torch']]} (torch), paired {statistics.median(r):.3f}x; prefill "
          f"{[round(p, 2) for _, p in res['kernel']]} vs {[round(p, 2) for _, p in res['torch']]}",
          flush=True)
