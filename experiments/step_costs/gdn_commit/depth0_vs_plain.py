"""A plain engine against an mtp8 `num_speculative_tokens=auto` engine whose requests fall to depth 0,
eager, alternated in one process: median pure decode step (StepTimings) and wall time.

    OMP_NUM_THREADS=2 python experiments/step_costs/gdn_commit/depth0_vs_plain.py [BATCH] [COST_PER_K]

The auto engine reads a step-cost file where k drafts cost 1 + COST_PER_K * k (default 0.9): with
the optimistic first estimates every request is admitted at depth 8 and falls to 0 once the
acceptance of random prompts is measured (COST_PER_K 1000: depth 0 from admission).
"""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
per_k = float(sys.argv[2]) if len(sys.argv) > 2 else 0.9
cost_file = Path(tempfile.mkdtemp()) / "step_costs.json"
cost_file.write_text(json.dumps({"step_costs": [{"k": k, "batch_size": b, "step_ms": 1.0 + per_k * k}
                                                for k in range(9) for b in (1, 64)]}))
kw = dict(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=B, max_model_len=256,
          record_step_timings=True)
engines = {"plain": LLM(**kw),
           "auto": LLM(spec="mtp8", num_speculative_tokens="auto", cost_model_file=cost_file, **kw)}
prompts = torch.randint(2, 2048, (B, 64), generator=torch.Generator().manual_seed(0)).tolist()
params = SamplingParams(max_tokens=48, ignore_eos=True)
wall = {name: [] for name in engines}
steps = {name: [] for name in engines}
tokens = {}
for rep in range(4):
    for name, llm in (list(engines.items()) if rep % 2 else list(engines.items())[::-1]):
        n0 = len(llm.engine.step_timings)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        wall[name].append(time.perf_counter() - t0)
        steps[name] += [1e3 * (t.verify_s + t.draft_s) for t in llm.engine.step_timings[n0:]
                        if t.num_decodes == B and t.num_prefill_tokens == 0]
        tokens[name] = [o.output_token_ids for o in outs]
print("identical tokens:", tokens["auto"] == tokens["plain"])
for name in engines:
    print(f"{name}: wall s {[round(x, 2) for x in wall[name]]}, median decode step "
          f"{statistics.median(steps[name]):.2f} ms")
print(f"auto / plain: wall {statistics.median(wall['auto']) / statistics.median(wall['plain']):.3f}, "
      f"decode step {statistics.median(steps['auto']) / statistics.median(steps['plain']):.3f}")
policy = engines["auto"].engine.draft_length
print("auto k per step:", dict(policy.histogram), "depths given:", dict(policy.depth_histogram))
