"""The compiled decode step on the CPU with the batch unpadded against padded to a capture size
(1, 2, 4, 8, 16, 24, ...), alternated call by call on one engine (the engine's sizes swapped;
no graph is added): plain decoding and mtp8 at 4 drafts, 192 known tokens, 10 pairs after 2.
usage: OMP_NUM_THREADS=1 python experiments/ragged_compiled/unpadded.py  (run on 58645f8, where
the engine still padded; the code after it pads only on CUDA)"""
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(1)
from mtpx import LLM  # noqa: E402
from mtpx.engine.decode_step import capture_sizes  # noqa: E402
for spec, k, ks in ((None, None, [0]), ("mtp8", 4, [4])):
    llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec=spec, num_speculative_tokens=k, max_num_seqs=64,
              compile=True, max_model_len=1024)
    eng, comp = llm.engine, llm.engine.compiled
    padded = capture_sizes(64)
    every = list(range(1, 65))
    for B in (3, 9, 12, 17, 33, 57):
        ms = {"pad": [], "exact": []}
        for r in range(12):
            for name in (("pad", "exact") if r % 2 else ("exact", "pad")):
                comp.sizes = padded if name == "pad" else every
                (t,) = eng.time_decode_steps(B, ks, 192, rounds=1, warmup=0)[ks[0]]
                if r >= 2:
                    ms[name].append(t)
        ratios = sorted(a / b for a, b in zip(ms["exact"], ms["pad"]))
        print(spec or "plain", B, "->", next(s for s in padded if s >= B),
              "exact %.2f pad %.2f ms, paired %.3f (%.3f-%.3f)" % (statistics.median(ms["exact"]),
                                                                   statistics.median(ms["pad"]),
              statistics.median(ratios), ratios[0], ratios[-1]), "graphs", comp.num_graphs, flush=True)
