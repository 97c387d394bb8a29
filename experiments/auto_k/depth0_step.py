"""The decode step of plain decoding against `num_speculative_tokens=auto` at depth 0 (every
request without draft modules: what auto runs at batch 64 when drafting is predicted not to pay),
at batch B and 192 known tokens (Engine.time_decode_steps: the calibration's step, no prefill),
the two engines alternated call by call in one process, N pairs. A ratio above 1 is the auto
engine's own overhead at depth 0; the spread of single pairs is the machine's noise.

    OMP_NUM_THREADS=2 python experiments/auto_k/depth0_step.py B N
"""
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

os.environ["MTPX_CACHE_DIR"] = tempfile.mkdtemp()
from mtpx import LLM  # noqa: E402

torch.set_num_threads(2)
B, N = int(sys.argv[1]), int(sys.argv[2])
kw = dict(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=B, max_model_len=1024)
plain = LLM(**kw)
auto = LLM(spec="mtp8", num_speculative_tokens="auto", **kw)
ms = {"plain": [], "auto": []}
for i in range(N):
    order = [("plain", plain), ("auto", auto)] if i % 2 == 0 else [("auto", auto), ("plain", plain)]
    for name, llm in order:
        ms[name] += llm.engine.time_decode_steps(B, [0], 192, rounds=1, warmup=1)[0]
ratios = [a / p for a, p in zip(ms["auto"], ms["plain"])]
q = statistics.quantiles(ratios, n=4)
print(f"batch {B}, {len(ratios)} pairs: plain {statistics.median(ms['plain']):.2f} ms, auto at depth 0 "
      f"{statistics.median(ms['auto']):.2f} ms; auto / plain median {statistics.median(ratios):.3f} "
      f"(quartiles {q[0]:.3f}-{q[2]:.3f}, min-max {min(ratios):.3f}-{max(ratios):.3f})")
