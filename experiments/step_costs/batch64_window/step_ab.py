"""The engine's decode step at batch B and k = 0, 1, 2, 4 (Engine.time_decode_steps: the
calibration's step, the ks alternated call by call, 8 timed rounds after one untimed) of a
fixed k = 4 multi-module engine (its k < 4 steps keep all four modules caught up), medians in ms
and each k's ratio to k = 0. Compare two trees (or two environments) by running the script of
each in alternating processes.

    OMP_NUM_THREADS=2 python experiments/step_costs/batch64_window/step_ab.py B
"""
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1])
ks = [0, 1, 2, 4]
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=max(ks),
          max_num_seqs=B, max_model_len=1024)
times = llm.engine.time_decode_steps(B, ks, 192, rounds=8)
med = {k: statistics.median(v) for k, v in times.items()}
print(f"{ROOT.name}, batch {B}: " + ", ".join(
    f"k={k} {med[k]:.1f} ms ({med[k] / med[0]:.2f}x)" for k in ks))
