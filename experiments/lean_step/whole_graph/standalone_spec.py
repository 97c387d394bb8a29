"""mtp8 verifying and proposing 4 drafts at batch 64, context 200 (Engine.time_decode_steps, the
step bench_floor times), alone: 3 untimed steps, then 3 under torch.profiler; eager or compiled
(regions). Outputs: standalone_spec_{eager,compiled}.txt.

    OMP_NUM_THREADS=1 python experiments/lean_step/whole_graph/standalone_spec.py eager|compiled
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import profile  # noqa: E402

from mtpx import LLM  # noqa: E402

torch.set_num_threads(1)
B, k = 64, 4
e = LLM(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=B, compile=sys.argv[1] == "compiled",
        spec="mtp8", num_speculative_tokens=k).engine
print("untimed", [round(x, 1) for x in e.time_decode_steps(B, [k], 200, rounds=3)[k]])
with profile(record_shapes=False) as p:
    ms = e.time_decode_steps(B, [k], 200, rounds=3, warmup=0)[k]
print("profiled steps, ms:", [round(x, 1) for x in ms])
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
