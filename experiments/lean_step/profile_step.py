"""torch.profiler over the engine's eager decode step (Engine.time_decode_steps, no prefill) at
batch B, context 200, plain decoding (spec none) or mtp8 at k drafts: 5 profiled steps after 3
untimed, the 25 largest ops by self CPU time (divide by 5 for one step).

    OMP_NUM_THREADS=T python experiments/lean_step/profile_step.py B [k] [--compile]   (T threads, default 2)

--compile: the compiled step (LLM(compile=True)); Inductor's fused kernels show under their
graph names, the matmuls it leaves to ATen as aten::mm / addmm.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import profile  # noqa: E402

from mtpx import LLM  # noqa: E402

torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "2")))
compile = "--compile" in sys.argv
argv = [a for a in sys.argv if a != "--compile"]
B = int(argv[1])
k = int(argv[2]) if len(argv) > 2 else None
spec = {} if k is None else dict(spec="mtp8", num_speculative_tokens=8)
k = k or 0
e = LLM(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=B, compile=compile, **spec).engine
print("untimed steps, ms:", [round(x, 1) for x in e.time_decode_steps(B, [k], 200, rounds=3)[k]])
with profile(record_shapes=False) as p:
    ms = e.time_decode_steps(B, [k], 200, rounds=5, warmup=0)[k]
print("profiled steps, ms:", [round(x, 1) for x in ms])
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=40))
