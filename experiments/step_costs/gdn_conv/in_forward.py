"""F.conv1d against the fused taps for the Gated DeltaNet conv inside the demo target's
verification forward (batch 16 and 64, T = 2, 5, 9 tokens, context 192), alternated call by
call, 12 pairs after one untimed pair: alone F.conv1d is faster at batch 64 (forms.md), inside
the forward is it? Prints the median ms of each and the median paired ratio conv1d / taps.

    OMP_NUM_THREADS=2 python experiments/step_costs/gdn_conv/in_forward.py
"""
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mtpx import LLM  # noqa: E402
from mtpx.engine.compiled import verify_forward  # noqa: E402
from mtpx.models import deltanet  # noqa: E402

torch.set_num_threads(2)


def taps(ext, weight):
    K = weight.shape[-1]
    T = ext.shape[-1] - K + 1
    w = weight[:, 0]
    out = ext[..., :T] * w[:, :1]
    for j in range(1, K):
        out.addcmul_(ext[..., j: j + T], w[:, j: j + 1])
    return out


def conv1d(ext, weight):
    return F.conv1d(ext, weight, groups=weight.shape[0])


print("| batch | T | taps ms | F.conv1d ms | conv1d / taps (paired median) |\n|---:|---:|---:|---:|---:|")
for B in (16, 64):
    llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=8,
              max_num_seqs=B, max_model_len=1024)
    cache, model = llm.engine.runner.cache, llm.model
    for T in (2, 5, 9):
        meta = cache.static_meta(torch.full((B,), 192), torch.full((B,), T), torch.arange(B), T,
                                 -(-(192 + 30) // cache.block_size), keep_states=True)
        times = {"taps": [], "conv1d": []}
        with torch.inference_mode():
            for i in range(13):
                pair = (("taps", taps), ("conv1d", conv1d))
                for name, fn in (pair if i % 2 else pair[::-1]):
                    deltanet.causal_conv = fn
                    t0 = time.perf_counter()
                    verify_forward(model, cache, meta)
                    dt = time.perf_counter() - t0
                    cache.clear_pending()
                    if i:
                        times[name].append(1e3 * dt)
        r = [b / a for a, b in zip(times["taps"], times["conv1d"])]
        print(f"| {B} | {T} | {statistics.median(times['taps']):.2f} | "
              f"{statistics.median(times['conv1d']):.2f} | "
              f"{statistics.median(r):.3f} |", flush=True)
