"""The Gated DeltaNet commit at the accepted token, eager against compiled, alternated in one
process on the demo's mtp8 engine (engine.compile): 9-token windows, accepted index 0, batch 1
(padded to 2) and 16, medians of 30 calls each after a fresh verification forward.

    OMP_NUM_THREADS=2 python experiments/step_costs/commit_ab.py
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.engine.compiled import block_bucket  # noqa: E402

torch.set_num_threads(2)
llm = LLM(spec="mtp8", compile=True, max_num_seqs=16, max_model_len=256)
cache, compiled = llm.engine.runner.cache, llm.engine.runner.compiled
g = torch.Generator().manual_seed(0)
k, n = 8, 64
for B in (1, 16):
    llm.generate(torch.randint(2, 2048, (B, n), generator=g).tolist(),
                 SamplingParams(max_tokens=30, ignore_eos=True))
    Bp = compiled.padded_batch(B)
    nb = block_bucket(n + 2 * k + 2, cache.block_size, cache.max_blocks)
    rows = torch.tensor(list(range(B)) + [cache.pad_row] * (Bp - B))
    meta = cache.static_meta(torch.full((Bp,), n), torch.tensor([k + 1] * B + [0] * (Bp - B)), rows, k + 1,
                             nb, keep_states=True)
    accepted = torch.zeros(Bp, dtype=torch.long)
    fns = {"eager": lambda a=accepted: cache.commit_recurrent(a, None),
           "compiled": lambda a=accepted: compiled.commit(a, None)}
    with torch.inference_mode():
        for fn in fns.values():
            compiled.verify(meta)
            fn()
        times = {name: [] for name in fns}
        for rep in range(30):
            for name, fn in (list(fns.items()) if rep % 2 else list(fns.items())[::-1]):
                compiled.verify(meta)
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    print(f"batch {B}: commit ms " + ", ".join(f"{name} {1e3 * statistics.median(v):.2f}"
                                               for name, v in times.items()),
          flush=True)
