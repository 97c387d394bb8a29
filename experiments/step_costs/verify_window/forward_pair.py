"""The compiled 1-token and 9-token target forwards of one mtp8 engine at batch 1, alternated call by
call (as tools/bench_step.py's target(1) / target(k+1), without the rest of that benchmark), with
the engine's Inductor options or, with --cpp-gemm, also Inductor's weight freezing and its C++
GEMM templates (max_autotune with the CPP backend; template epilogue fusion off: the batched-matmul
template failed to render a fused epilogue here).

    python experiments/step_costs/verify_window/forward_pair.py [--cpp-gemm]

Compiling takes about 15 minutes on 2 cores (about 25 with --cpp-gemm, whose frozen graphs
Inductor's FX graph cache did not keep: every process compiles them again).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.engine.compiled import block_bucket  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
ap.add_argument("--cpp-gemm", action="store_true")
ap.add_argument("--repeats", type=int, default=30)
args = ap.parse_args()
torch.set_num_threads(2)
if args.cpp_gemm:
    inductor_config.freezing = True
    inductor_config.max_autotune = True
    inductor_config.max_autotune_gemm_backends = "CPP,ATEN"
    inductor_config.epilogue_fusion = False
t_start = time.time()
llm = LLM(model=args.model, spec="mtp8", max_num_seqs=1, compile=True, max_model_len=256)
g = torch.Generator().manual_seed(0)
n = 64
llm.generate(torch.randint(2, llm.model.cfg.vocab_size, (1, n), generator=g).tolist(),
             SamplingParams(max_tokens=40, ignore_eos=True))
print("engine start-up and first request %.0f s" % (time.time() - t_start), flush=True)
runner = llm.engine.runner
cache, k, compiled = runner.cache, runner.num_speculative_tokens, runner.compiled
Bp = compiled.padded_batch(1)
nb = block_bucket(n + 2 * k + 2, cache.block_size, cache.max_blocks)
rows = torch.tensor([0] + [cache.pad_row] * (Bp - 1))
starts = torch.full((Bp,), n)
window = cache.static_meta(starts, torch.tensor([k + 1] + [0] * (Bp - 1)), rows, k + 1, nb, keep_states=True)
one = cache.static_meta(starts, torch.tensor([1] + [0] * (Bp - 1)), rows, 1, nb)
with torch.inference_mode():
    for _ in range(3):
        compiled.verify(window)
        compiled.verify(one)
    pairs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        compiled.verify(one)
        t1 = time.perf_counter()
        compiled.verify(window)
        pairs.append((t1 - t0, time.perf_counter() - t1))
print("%s: 1-token %.2f ms, %d-token %.2f ms, paired ratio %.2f (medians of %d pairs)" % (
    "cpp-gemm" if args.cpp_gemm else "default", 1e3 * statistics.median(a for a, _ in pairs), k + 1,
    1e3 * statistics.median(b for _, b in pairs), statistics.median(b / a for a, b in pairs), args.repeats))
