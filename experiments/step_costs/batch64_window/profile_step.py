"""torch.profiler over the engine's own decode step (Engine.time_decode_steps: the calibration's
step, no prefill) at batch B with k drafts verified and proposed, on a fixed-k multi-module
engine: 5 profiled steps after 3 untimed, ops grouped by input shape, the 25 largest by self CPU
time (divide by 5 for one step).

    OMP_NUM_THREADS=2 python experiments/step_costs/batch64_window/profile_step.py B k
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import profile  # noqa: E402

from mtpx import LLM  # noqa: E402

torch.set_num_threads(2)
B, k = int(sys.argv[1]), int(sys.argv[2])
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=max(k, 1),
          max_num_seqs=B, max_model_len=1024)
e = llm.engine
print("untimed steps, ms:", [round(x, 1) for x in e.time_decode_steps(B, [k], 192, rounds=3)[k]])
with profile(record_shapes=True) as p:
    ms = e.time_decode_steps(B, [k], 192, rounds=5, warmup=0)[k]
print("profiled steps, ms:", [round(x, 1) for x in ms])
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25,
                                                      max_name_column_width=40, max_shapes_column_width=80))
