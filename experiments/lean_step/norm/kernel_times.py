"""Time each C kernel's calls within the eager decode step (Engine.time_decode_steps: B requests at
200 known tokens, plain decoding or mtp8 verifying k drafts): each kernel's ctypes function
wrapped with a timer, 5 steps after 2 untimed.

    OMP_NUM_THREADS=1 python experiments/lean_step/norm/kernel_times.py B [k]
"""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import mtpx.attention.cpu_kernel as attention  # noqa: E402
import mtpx.models.cpu_ops as cpu_ops  # noqa: E402
import mtpx.models.gdn_kernel as gdn  # noqa: E402
from mtpx import LLM  # noqa: E402

torch.set_num_threads(1)
B = int(sys.argv[1])
k = int(sys.argv[2]) if len(sys.argv) > 2 else 0
spec = dict(spec="mtp8", num_speculative_tokens=8) if k else {}
engine = LLM(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=B, **spec).engine
engine.time_decode_steps(B, [k], 200, rounds=2)
seconds: dict[str, float] = {}


def timed(module, attr: str, name: str) -> None:
    fn = getattr(module, attr)

    def call(*args):
        t0 = time.perf_counter()
        out = fn(*args)
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
        return out

    setattr(module, attr, call)


gdn.available(), attention.available(), cpu_ops.available()
for module, attr, name in [(gdn, "_fn", "gdn_decode"), (gdn, "_window", "gdn_window"),
                           (attention, "_fn", "paged_attention"), (cpu_ops, "_fn", "rms_norm"),
                           (cpu_ops, "_act", "silu_and_mul")]:
    timed(module, attr, name)
rounds = 5
ms = engine.time_decode_steps(B, [k], 200, rounds=rounds, warmup=0)[k]
print("steps ms", [round(x, 1) for x in ms])
for name, s in seconds.items():
    print(name, round(s / rounds * 1e3, 2), "ms per step")
