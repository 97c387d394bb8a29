"""The Gated DeltaNet conv's forms (mtpx.models.deltanet.causal_conv) against the unfolded sum it
used everywhere before, inside the target's decode forward: the demo's 32-layer target over T
tokens per request (a verification window; T = 1 is plain decoding's forward; T = 64 a prefill
chunk, whose states are stored instead of kept) at batch B, the
two forms alternated call by call, ROUNDS pairs after one untimed pair. Prints the median ms of
each and the median of the paired ratios (new / old). Eager, fp32 (or DTYPE), 2 threads.

    OMP_NUM_THREADS=2 python experiments/step_costs/gdn_conv/forward_ab.py [ROUNDS] [DTYPE]
"""
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM  # noqa: E402
from mtpx.engine.compiled import verify_forward  # noqa: E402
from mtpx.models import deltanet  # noqa: E402

torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
dtype = sys.argv[2] if len(sys.argv) > 2 else "float32"
new = deltanet.causal_conv


def old(ext, weight):
    """The form every call used before."""
    return (ext.unfold(-1, weight.shape[-1], 1) * weight[:, 0, None, :]).sum(-1)


print(f"demo target, {dtype}, 2 threads, context 192; ms medians of {rounds} alternated pairs")
print("| batch | T | old ms | new ms | new / old (paired median, min-max) |")
print("|---:|---:|---:|---:|---|")
for B in (1, 4, 16, 64):
    llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=8,
              max_num_seqs=B, max_model_len=1024, dtype=dtype)
    cache, model = llm.engine.runner.cache, llm.model
    n = 192
    rows, starts = torch.arange(B), torch.full((B,), n)
    for T in (1, 2, 5, 9, 64):
        meta = cache.static_meta(starts, torch.full((B,), T), rows, T, -(-(n + T + 20) // cache.block_size),
                                 keep_states=1 < T < 64)
        times = {"old": [], "new": []}
        with torch.inference_mode():
            for i in range(rounds + 1):
                for name, fn in (("old", old), ("new", new)) if i % 2 else (("new", new), ("old", old)):
                    deltanet.causal_conv = fn
                    t0 = time.perf_counter()
                    verify_forward(model, cache, meta)
                    dt = time.perf_counter() - t0
                    cache.clear_pending()
                    if i:
                        times[name].append(1e3 * dt)
        deltanet.causal_conv = new
        r = [b / a for a, b in zip(times["old"], times["new"])]
        print(f"| {B} | {T} | {statistics.median(times['old']):.2f} | {statistics.median(times['new']):.2f} "
              f"| {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) |", flush=True)
    del llm
