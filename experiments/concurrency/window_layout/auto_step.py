"""The decode step of an automatic-k engine (spec=mtp8, num_speculative_tokens=auto: its buffers
sized for 8 drafts) against a fixed mtp4 engine's, both at k = 4, batch B, context 200
(Engine.time_decode_steps: the runner's step without the policy), 15 rounds each, alternated
engine by engine, 3 times.

    OMP_NUM_THREADS=1 python experiments/concurrency/window_layout/auto_step.py [B]
"""
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

from mtpx import LLM  # noqa: E402

torch.set_num_threads(1)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 16
model = str(ROOT / "checkpoints" / "demo")
fixed = LLM(model=model, max_num_seqs=B, spec="mtp8", num_speculative_tokens=4).engine
auto = LLM(model=model, max_num_seqs=B, spec="mtp8", num_speculative_tokens="auto").engine
for _ in range(3):
    a = statistics.median(fixed.time_decode_steps(B, [4], 200, rounds=15)[4])
    b = statistics.median(auto.time_decode_steps(B, [4], 200, rounds=15)[4])
    print(f"batch {B}, k = 4: mtp4 engine {a:.2f} ms, auto engine {b:.2f} ms, auto / mtp4 {b / a:.3f}")
