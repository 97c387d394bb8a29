"""What padding a batch of one to two costs the compiled verification forward: the demo's target
over a 9-token window at batch 1 padded to 2 (the pad row computes too) and unpadded, beside the
1-token forward padded to 2, in one process, alternated, 60 calls each (engine.compile's verify
graph, compiled once at batch 2; the unpadded call runs in that graph).

    OMP_NUM_THREADS=2 python experiments/step_costs/batch1_unpadded.py
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from mtpx.cache.model_cache import ModelCache  # noqa: E402
from mtpx.engine.compiled import CompiledDecode, block_bucket  # noqa: E402
from mtpx.hf.loader import load_pretrained  # noqa: E402

torch.set_num_threads(2)
model = load_pretrained(Path(__file__).resolve().parents[2] / "checkpoints" / "demo")[0].eval()
k, n = 8, 64
cache = ModelCache(model, 4, 256, 8).static_block_tables()


class _Speculator:  # what CompiledDecode reads of a speculator when only verify is called
    num_speculative_tokens = k

    def persistent_buffers(self):
        return []


compiled = CompiledDecode(model, cache, _Speculator())
nb = block_bucket(n + 2 * k + 2, cache.block_size, cache.max_blocks)
pad = torch.tensor([0, cache.pad_row])
metas = {"1 token, padded to 2": cache.static_meta(torch.full((2,), n), torch.tensor([1, 0]), pad, 1, nb,
                                                   keep_states=True),
         "9 tokens, padded to 2": cache.static_meta(torch.full((2,), n), torch.tensor([9, 0]), pad, 9, nb,
                                                    keep_states=True),
         "9 tokens, unpadded": cache.static_meta(torch.full((1,), n), torch.tensor([9]), torch.tensor([0]), 9,
                                                 nb, keep_states=True)}
with torch.inference_mode():
    for m in metas.values():
        compiled.verify(m)
    times = {name: [] for name in metas}
    for rep in range(60):
        items = list(metas.items())
        for name, m in (items if rep % 2 else items[::-1]):
            t0 = time.perf_counter()
            compiled.verify(m)
            times[name].append(time.perf_counter() - t0)
for name, v in times.items():
    q = statistics.quantiles(v, n=4)
    print(f"{name}: median {1e3 * statistics.median(v):.2f} ms (quartiles {1e3 * q[0]:.2f}-{1e3 * q[2]:.2f})")
print(f"graphs compiled: {compiled.num_graphs}")
