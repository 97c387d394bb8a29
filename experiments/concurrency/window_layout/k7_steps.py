"""Automatic k alone at concurrency 1 (GSM8K test, first 64 prompts, 128 tokens, eager, 1 thread):
every steady step its policy learns from (observe_step), as measured / calibrated per k, with the
steps over 1.3x listed, and the corrections at the end.

    MTPX_DATA_DIR=../shared/data OMP_NUM_THREADS=1 python experiments/concurrency/window_layout/k7_steps.py
"""
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402
torch.set_num_threads(1)
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

prompts = [format_prompt(r["question"])
           for r in load_gsm8k(os.environ["MTPX_DATA_DIR"] + "/gsm8k/test.jsonl")[:64]]
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
          max_num_seqs=1, max_model_len=1024)
pol = llm.engine.draft_length
log = []
orig = pol.observe_step


def obs(k, b, ms, *a, **kw):
    log.append((k, b, ms, pol.calibrated_cost(k, b), kw.get("draft_depth")))
    return orig(k, b, ms, *a, **kw)


pol.observe_step = obs
outs = llm.generate(prompts, SamplingParams(max_tokens=128), max_concurrency=1)
by = {}
for i, (k, _b, ms, cal, _d) in enumerate(log):
    by.setdefault(k, []).append((i, ms / cal))
for k, v in sorted(by.items()):
    r = [x for _, x in v]
    q = statistics.quantiles(r, n=10) if len(r) > 10 else r
    print(f"k={k}: {len(r)} steps, ratio median {statistics.median(r):.3f}, deciles "
          f"{[round(x, 2) for x in q]}, max {max(r):.2f}")
    big = [(i, round(x, 2)) for i, x in v if x > 1.3]
    print("   dear steps (index, ratio):", big[:30], len(big))
print("corrections", {k: round(v, 3) for k, v in pol.correction.items()})
