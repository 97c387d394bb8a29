"""The Gated DeltaNet commit alone, eager and compiled (engine.compile's commit graph only), on the
demo's 24 Gated DeltaNet layers: a 9-token verification window (mtp8), accepted index 0, rows of a
64-slot cache, medians of 30 alternated calls each after a fresh (eager) verification forward.

    OMP_NUM_THREADS=2 python experiments/step_costs/gdn_commit/commit_alone.py [TREE] [BATCH ...]

TREE: the source tree to import mtpx from (default: this one; e.g. a git worktree of an older
commit, to compare the two in turn).
"""
import statistics
import sys
import time
from pathlib import Path

TREE = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[3]).resolve()
sys.path.insert(0, str(TREE))

import torch  # noqa: E402

from mtpx.cache.model_cache import ModelCache  # noqa: E402
from mtpx.engine.compiled import CompiledDecode, block_bucket, verify_forward  # noqa: E402
from mtpx.hf.loader import load_pretrained  # noqa: E402

torch.set_num_threads(2)
model = load_pretrained(TREE / "checkpoints" / "demo")[0].eval()
k, n = 8, 64
cache = ModelCache(model, 64, 256, 8).static_block_tables()


class _Speculator:  # what CompiledDecode reads of a speculator when only the commit is called
    num_speculative_tokens = k

    def persistent_buffers(self):
        return []


compiled = CompiledDecode(model, cache, _Speculator())
for B in [int(x) for x in sys.argv[2:]] or [2, 16, 64]:
    rows = torch.arange(B)
    nb = block_bucket(n + 2 * k + 2, cache.block_size, cache.max_blocks)
    meta = cache.static_meta(torch.full((B,), n), torch.full((B,), k + 1), rows, k + 1, nb, keep_states=True)
    accepted = torch.zeros(B, dtype=torch.long)
    fns = {"eager": lambda a=accepted: cache.commit_recurrent(a, None),
           "compiled": lambda a=accepted: compiled.commit(a, None)}
    with torch.inference_mode():
        for fn in fns.values():
            verify_forward(model, cache, meta)
            fn()
        times = {name: [] for name in fns}
        for rep in range(30):
            for name, fn in (list(fns.items()) if rep % 2 else list(fns.items())[::-1]):
                verify_forward(model, cache, meta)
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    print(f"{TREE.name} batch {B}: commit ms " + ", ".join(
        f"{name} {1e3 * statistics.median(v):.2f}" for name, v in times.items()), flush=True)
