"""An auto engine forced to k = 4 and 8 (its requests admitted at that depth, as in the
calibration) against fixed k = 4 and 8 engines, on the same random prompts, eager, demo, three
rounds in one process: median decode step (verify + draft) per engine and k8 / k4 for each kind.

    OMP_NUM_THREADS=2 python experiments/auto_k/main_job/auto_vs_fixed_depth.py BATCH
"""
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.auto_k.store import save_step_costs  # noqa: E402
from mtpx.auto_k.costs import step_costs  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1])
M = str(ROOT / "checkpoints" / "demo")
fake = Path(tempfile.mkdtemp()) / "costs.json"
save_step_costs(fake, {(k, B): 10.0 + k for k in range(9)}, {})
auto = LLM(model=M, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=B, max_model_len=1024,
           cost_model_file=fake)
fixed = {k: LLM(model=M, spec="mtp8", num_speculative_tokens=k, max_num_seqs=B,
                max_model_len=1024) for k in (4, 8)}
g = torch.Generator().manual_seed(3)
ms = {}
for rep in range(3):
    prompts = torch.randint(2, 2000, (B, 128), generator=g).tolist()
    for k in (4, 8):
        for name, llm in (("auto", auto), ("fixed", fixed[k])):
            auto.engine.draft_length.forced = k
            llm.engine.reset_step_timings()
            llm.generate(prompts, SamplingParams(max_tokens=60, ignore_eos=True))
            ms.setdefault((name, k), []).append(step_costs(llm.engine.step_timings, k)[B]["step_ms"])
            print(f"round {rep}: {name} k={k} step {ms[(name, k)][-1]:.1f} ms", flush=True)
for name in ("auto", "fixed"):
    print(f"{name}: k8/k4 per round " + ", ".join(f"{a / b:.2f}"
                                                  for a, b in zip(ms[(name, 8)], ms[(name, 4)])))
print("auto / fixed per round, k=4: " + ", ".join(f"{a / b:.2f}"
                                                  for a, b in zip(ms[("auto", 4)], ms[("fixed", 4)]))
      + "; k=8: " + ", ".join(f"{a / b:.2f}" for a, b in zip(ms[("auto", 8)], ms[("fixed", 8)])))
print("medians (ms): " + ", ".join(f"{n} k={k} {statistics.median(v):.1f}" for (n, k), v in ms.items()))
