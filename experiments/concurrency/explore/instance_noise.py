"""Four engines in one process (two automatic-k, two fixed k = 1, one checkpoint) time their batch-64
k = 1 decode step in turn, three times over: how far apart do identical steps read on this machine?

    python experiments/concurrency/explore/instance_noise.py
"""
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from mtpx import LLM  # noqa: E402

torch.set_num_threads(1)
kw = dict(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=64, max_model_len=1024)
engines = {"auto A": LLM(spec="mtp8", num_speculative_tokens="auto", **kw).engine,
           "fixed1 A": LLM(spec="mtp8", num_speculative_tokens=1, **kw).engine,
           "fixed1 B": LLM(spec="mtp8", num_speculative_tokens=1, **kw).engine,
           "auto B": LLM(spec="mtp8", num_speculative_tokens="auto", **kw).engine}
ms = {name: [] for name in engines}
for _ in range(3):
    for name, engine in engines.items():
        ms[name].extend(engine.time_decode_steps(64, [1], 192, rounds=3)[1])
for name, v in ms.items():
    print(name, round(statistics.median(v), 1), [round(x) for x in v])
