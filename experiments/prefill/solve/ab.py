"""The chunked Gated DeltaNet prefill with LAPACK's unit-triangular solve (`unit_lower_solve`)
against the block inverse before it (`unit_lower_inverse`), alternated in one process: (1) the
prefill of one request of n random tokens (eager, the engine's path), median of 15 pairs; (2) the
first chunk of bench_speedup's concurrency-16 cell (32 GSM8K test prompts, 128 tokens), compiled
plain decoding and mtp4, 3 pairs: the chunk's wall and its prefill steps' seconds.
usage: OMP_NUM_THREADS=1 MTPX_DATA_DIR=../shared/data python experiments/prefill/solve/ab.py"""
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)
import mtpx.models.gated_delta_rule as gdr  # noqa: E402
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

solve = gdr.unit_lower_solve


def inverse(L, *rhs):
    W = gdr.unit_lower_inverse(L)
    return tuple(W @ r for r in rhs)


def use(name):
    gdr.unit_lower_solve = solve if name == "solve" else inverse


model = str(ROOT / "checkpoints" / "demo")
llm = LLM(model=model, max_num_seqs=16, max_model_len=1024)
g = torch.Generator().manual_seed(0)
print("one-request prefill (ms), eager, solve / inverse")
for n in (24, 40, 95, 150, 300):
    ms = {"solve": [], "inverse": []}
    for i in range(17):
        p = torch.randint(2, 2000, (n,), generator=g).tolist()
        for name in (("solve", "inverse") if i % 2 else ("inverse", "solve")):
            use(name)
            llm.engine.reset_step_timings()
            llm.generate([p], SamplingParams(max_tokens=1, ignore_eos=True))
            if i >= 2:
                ms[name].append(1e3 * sum(t.prefill_s for t in llm.engine.step_timings))
    ratios = [a / b for a, b in zip(ms["solve"], ms["inverse"])]
    print(f"  n={n}: {statistics.median(ms['solve']):.1f} / {statistics.median(ms['inverse']):.1f} ms, "
          f"paired {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})", flush=True)
prompts = [format_prompt(r["question"]) for r in load_gsm8k(
    os.path.join(os.environ.get("MTPX_DATA_DIR", "../shared/data"), "gsm8k/test.jsonl"))[:128]][0::4]
for spec, k in ((None, None), ("mtp8", 4)):
    eng = LLM(model=model, spec=spec, num_speculative_tokens=k, max_num_seqs=16, compile=True,
              max_model_len=1024)
    res = {"solve": [], "inverse": []}
    for i in range(4):
        for name in (("solve", "inverse") if i % 2 else ("inverse", "solve")):
            use(name)
            eng.engine.reset_step_timings()
            t0 = time.perf_counter()
            eng.generate(prompts, SamplingParams(max_tokens=128), max_concurrency=16)
            wall = time.perf_counter() - t0
            if i >= 1:
                res[name].append((wall, sum(t.prefill_s for t in eng.engine.step_timings)))
    label = "plain" if spec is None else "mtp4"
    print(f"compiled c16 chunk 0, {label}: wall {[round(w, 2) for w, _ in res['solve']]} s (solve) "
          f"vs {[round(w, 2) for w, _ in res['inverse']]} (inverse); prefill "
          f"{[round(p, 2) for _, p in res['solve']]} "
          f"vs {[round(p, 2) for _, p in res['inverse']]}", flush=True)
