"""The main job's workload (`python train_or_eval.py +spec=mtp8`: the 64 built-in prompts, greedy,
at most 128 tokens, eos ends a request, all 64 in flight) on plain decoding, fixed k = 8 and 4,
and num_speculative_tokens=auto, eager, in one process, alternated per round in a rotated order.
auto's step costs come from the step-cost cache (calibrated first when the cache has none).

    OMP_NUM_THREADS=2 python experiments/auto_k/main_job/main_job.py [ROUNDS] > OUT.md
"""
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.prompts import load_prompts  # noqa: E402

torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
kw = dict(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=64)
t0 = time.perf_counter()
engines = {"plain": LLM(**kw), "mtp8": LLM(spec="mtp8", **kw),
           "mtp4": LLM(spec="mtp8", num_speculative_tokens=4, **kw),
           "auto": LLM(spec="mtp8", num_speculative_tokens="auto", **kw)}
print(f"auto: step costs {engines['auto'].calibration['source']} "
      f"({engines['auto'].calibration['seconds']:.1f} s); "
      f"engines built in {time.perf_counter() - t0:.1f} s\n")
llm0 = engines["plain"]
prompts = load_prompts({"name": "builtin", "prompt_tokens": 128}, 64, llm0.tokenizer,
                       llm0.model.cfg.vocab_size)
inputs = [p.engine_input for p in prompts]
params = SamplingParams(max_tokens=128)
tok_s = {n: [] for n in engines}
tokens = {}
mismatches = {n: 0 for n in engines}
names = list(engines)
for r in range(rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    for n in order:
        t = time.perf_counter()
        outs = engines[n].generate(inputs, params)
        dt = time.perf_counter() - t
        ids = [list(o.output_token_ids) for o in outs]
        tok_s[n].append(sum(map(len, ids)) / dt)
        if n == "plain":
            tokens.setdefault("plain", ids)
        else:
            tokens.setdefault(n, ids)
    for n in names:
        mismatches[n] = sum(a != b for a, b in zip(tokens[n], tokens["plain"]))
print(f"{rounds} rounds, contenders rotated per round; output tok/s per round, and each round's ratio to "
      "plain's")
print("\n| contender | tok/s (median of rounds) | / plain, per round | / plain, median | mismatches |")
print("|---|---:|---|---:|---:|")
for n in names:
    ratios = [a / b for a, b in zip(tok_s[n], tok_s["plain"])]
    print(f"| {n} | {statistics.median(tok_s[n]):.1f} | {' '.join(f'{x:.2f}' for x in ratios)} | "
          f"{statistics.median(ratios):.2f}x | {mismatches[n]} |")
s = engines["auto"].engine.draft_length.summary()
print(f"\nauto: k per decode step {s['k_histogram']}, depth per request {s['depth_histogram']}")
