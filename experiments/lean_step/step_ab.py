"""Paired A/B of the eager decode step (Engine.time_decode_steps, the calibration's step: B
requests at 200 known tokens, no prefill) with a lean-step change off (A, the previous code path)
and on (B), alternated call by call in one process, `pairs` pairs after 2 untimed; prints the
medians (quartiles) of A, B and of the paired ratios B / A, in wall time and in the CPU time of
the step's thread (time.thread_time around ModelRunner._decode; with 1 thread, what the step
computed, which other processes sharing the cores move less than its wall time).

    OMP_NUM_THREADS=T python experiments/lean_step/step_ab.py CHANGE B CASE [pairs] [T] [TUNE]

CHANGE: rows (Gated DeltaNet states read and written as views of an ascending run of batch
slots), inplace (the one-token delta-rule step in place), both (those two), scratch (the attention's
paged-KV gather into reused buffers), all (the three), norm (the pointwise kernels, RMSNorm with the
residual add fused and SwiGLU's silu_and_mul, mtpx/models/cpu_ops.py; later than the others, which
are on in every run); CASE: plain or mtp8:K; TUNE: 1 (default)
or 0, the engine's tune_malloc (glibc mallopt, per process: cannot alternate within one; the
launcher alternates processes).
"""
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import mtpx.attention.torch_backend as backend_mod  # noqa: E402
import mtpx.engine.model_runner as runner_mod  # noqa: E402
import mtpx.models.deltanet as deltanet_mod  # noqa: E402
import mtpx.models.cpu_ops as cpu_ops  # noqa: E402
from mtpx import LLM  # noqa: E402

change, B, case = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pairs = int(sys.argv[4]) if len(sys.argv) > 4 else 15
torch.set_num_threads(int(sys.argv[5]) if len(sys.argv) > 5 else 2)
tune = bool(int(sys.argv[6])) if len(sys.argv) > 6 else True
row_run, in_place = runner_mod.ascending_run, deltanet_mod.recurrent_step_in_place
toggles = {"rows": [("row_run", row_run)], "inplace": [("in_place", in_place)]}
toggles["both"] = toggles["rows"] + toggles["inplace"]
toggles["scratch"] = [("scratch", None)]
toggles["all"] = toggles["both"] + toggles["scratch"]
toggles["norm"] = [("norm", None)]


def switch(on: bool) -> None:
    for name, fn in toggles[change]:
        if name == "scratch":
            backend_mod.reuse_scratch = on
        elif name == "norm":
            cpu_ops.use_kernel = on
        elif name == "row_run":
            runner_mod.ascending_run = fn if on else (lambda rows: None)
        else:
            deltanet_mod.recurrent_step_in_place = fn if on else (lambda *a: False)


if case == "plain":
    k, llm = 0, LLM(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=B, tune_malloc=tune)
else:
    k = int(case.split(":")[1])
    llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=8, max_num_seqs=B,
              tune_malloc=tune)
e = llm.engine
decode, cpu_ms = e.runner._decode, []


def timed_decode(*args):
    t0 = time.thread_time()
    out = decode(*args)
    cpu_ms.append(1e3 * (time.thread_time() - t0))
    return out


e.runner._decode = timed_decode
times = {False: [], True: []}
cpu = {False: [], True: []}
for i in range(pairs + 2):
    for on in ((False, True) if i % 2 == 0 else (True, False)):
        switch(on)
        ms = e.time_decode_steps(B, [k], 200, rounds=1, warmup=0)[k][0]
        if i >= 2:
            times[on].append(ms)
            cpu[on].append(cpu_ms[-1])
switch(True)
q = lambda xs: statistics.quantiles(xs, n=4)  # noqa: E731
fmt = lambda xs: f"{statistics.median(xs):.2f} ({q(xs)[0]:.2f}-{q(xs)[2]:.2f})"  # noqa: E731
for name, t in (("wall", times), ("cpu", cpu)):
    ratios = [b / a for a, b in zip(t[False], t[True])]
    print(f"{change} batch {B} {case} {torch.get_num_threads()} thread(s) tune_malloc={int(tune)}, "
          f"{name}: A (off) {fmt(t[False])} ms, "
          f"B (on) {fmt(t[True])} ms, B / A {fmt(ratios)}, {pairs} pairs", flush=True)
