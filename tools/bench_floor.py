"""The decode step (eager, or compiled with --compile) against its matmul floor: one torch.mm of as
many FLOPs as the step's matmuls, timed on the same threads, alternated call by call with the step.

    OMP_NUM_THREADS=2 python tools/bench_floor.py [--model checkpoints/demo] [--batch-sizes 16 64]
        [--cases plain mtp8:4] [--context 200] [--pairs 15] [--threads 2] [--compile]
        [--engine KEY=VALUE ...] [--out FILE.json]

For each batch size B and case (plain: no speculator, k = 0; mtp8:K: the 8-module speculator
verifying and proposing K drafts) one engine is built; its step is Engine.time_decode_steps (the
calibration's step: B requests at `context` known tokens, no prefill).

FLOPs (multiply-adds x 2) are counted over one step by forward hooks: every nn.Linear the step
runs (rows x in_features x out_features, lm_head and the draft modules included) and every
attention call's QK^T and PV over the keys its valid tokens attend to (positions 0 .. p for a
token at position p; heads x head_dim per key). For plain decoding the hook count is checked
against the config: B x (weights of the target's Linears and lm_head) + the attention term.
Hooks do not run inside compiled graphs: with --compile the FLOPs are counted on an eager engine
of the same case (the same step, the same FLOPs) and the compiled engine (LLM(compile=True):
built and warmed up first, its build time printed) is timed.

The floor is one torch.mm [M, hidden] x [hidden, N] with M = B x (K + 1) (the verification's
rows) and N chosen so that 2 M hidden N equals the step's FLOPs, into a preallocated output (a
fresh [M, N] output, 98 MB at batch 64 with k = 4, costs its page faults, not FLOPs). Step and mm alternate,
one call each per pair, `pairs` pairs after 2 untimed; printed: medians with quartiles of step_ms and
floor_ms and of the paired ratios step / floor, in wall time and in the process's CPU time
(time.process_time around ModelRunner._decode and around the mm: with --threads 1 what each
computed, which other processes on shared cores move less than wall time; with more threads it
also counts the workers' waiting).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from bench_speedup import _overrides  # noqa: E402  (this script's folder, tools/)
from mtpx import LLM  # noqa: E402
from mtpx.models.attention import GatedAttention  # noqa: E402


def count_step_flops(engine, batch: int, k: int, context: int) -> dict:
    """FLOPs of one decode step (module doc): {"linear": ..., "attention": ..., "total": ...}."""
    model = engine.model
    counts = {"linear": 0, "attention": 0}

    def on_linear(mod, args, out):
        x = args[0]
        counts["linear"] += 2 * (x.numel() // mod.in_features) * mod.in_features * mod.out_features

    def on_attention(mod, args, kwargs, out):
        meta = kwargs.get("meta", args[4] if len(args) > 4 else None)
        if meta is None:
            return
        keys = int(((meta.positions + 1) * meta.valid).sum())        # keys attended, over tokens
        counts["attention"] += 2 * 2 * keys * mod.num_heads * mod.head_dim       # QK^T and PV

    hooks = [m.register_forward_hook(on_linear) for m in model.modules() if isinstance(m, nn.Linear)]
    hooks += [m.register_forward_hook(on_attention, with_kwargs=True)
              for m in model.modules() if isinstance(m, GatedAttention)]
    try:
        engine.time_decode_steps(batch, [k], context, rounds=1, warmup=0)
    finally:
        for h in hooks:
            h.remove()
    counts["total"] = counts["linear"] + counts["attention"]
    return counts


def config_linear_flops(model, batch: int) -> int:
    """2 x batch x the weights of the target's Linears and lm_head: plain decoding's linear FLOPs."""
    weights = sum(m.weight.numel() for m in model.model.modules() if isinstance(m, nn.Linear))
    return 2 * batch * (weights + model.lm_head.weight.numel())


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def build(model_path: str, batch: int, case: str, compile: bool, engine: dict | None = None):
    """(k, LLM) of a case: plain, or SPEC:K; engine: EngineConfig overrides (--engine)."""
    engine = engine or {}
    if case == "plain":
        return 0, LLM(model=model_path, max_num_seqs=batch, compile=compile, **engine)
    spec, k = case.split(":")
    return int(k), LLM(model=model_path, spec=spec, num_speculative_tokens=int(spec.removeprefix("mtp")),
                       max_num_seqs=batch, compile=compile, **engine)


def engine_overrides(pairs: list[str]) -> dict:
    """['compile_regions=false', ...] -> {"compile_regions": False, ...}, parsed as bench_speedup's
    contender settings ('plain+compile_regions=false')."""
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"error: --engine {pair!r}: use KEY=VALUE, "
                             "an engine key (docs/configuration.md)")
    return _overrides("+".join(["plain", *pairs]))[1]


def bench_case(model_path: str, batch: int, case: str, context: int, pairs: int,
               compile: bool = False, engine: dict | None = None) -> dict:
    k, llm = build(model_path, batch, case, compile=False, engine=engine)
    e = llm.engine
    e.time_decode_steps(batch, [k], context, rounds=1, warmup=1)               # untimed
    flops = count_step_flops(e, batch, k, context)
    config_flops = config_linear_flops(e.model, batch) if case == "plain" else None
    build_s = None
    if compile:
        del llm, e
        t0 = time.perf_counter()
        k, llm = build(model_path, batch, case, compile=True, engine=engine)
        build_s = time.perf_counter() - t0
        print(f"# {case} at batch {batch}: compiled and warmed up in {build_s:.1f} s", flush=True)
        e = llm.engine
        e.time_decode_steps(batch, [k], context, rounds=1, warmup=1)           # untimed
    hidden = e.model.cfg.hidden_size
    M = batch * (k + 1)
    N = max(1, round(flops["total"] / (2 * M * hidden)))
    a, b, c = torch.randn(M, hidden), torch.randn(hidden, N), torch.empty(M, N)

    def mm_ms() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b, out=c)
        return 1e3 * (time.perf_counter() - t0), 1e3 * (time.process_time() - c0)

    decode, step_cpu = e.runner._decode, []

    def timed_decode(*args):
        c0 = time.process_time()
        out = decode(*args)
        step_cpu.append(1e3 * (time.process_time() - c0))
        return out

    e.runner._decode = timed_decode
    steps, floors, steps_cpu, floors_cpu = [], [], [], []
    try:
        for i in range(pairs + 2):
            s = e.time_decode_steps(batch, [k], context, rounds=1, warmup=0)[k][0]
            f, f_cpu = mm_ms()
            if i >= 2:
                steps.append(s)
                floors.append(f)
                steps_cpu.append(step_cpu[-1])
                floors_cpu.append(f_cpu)
    finally:
        e.runner._decode = decode
    ratios = [s / f for s, f in zip(steps, floors)]
    ratios_cpu = [s / f for s, f in zip(steps_cpu, floors_cpu)]
    row = {"batch": batch, "case": case, "k": k, "context": context, "pairs": pairs,
           "compile": compile, "build_s": build_s, "flops": flops, "mm_shape": [M, hidden, N],
           "step_ms": quartiles(steps), "floor_ms": quartiles(floors), "ratio": quartiles(ratios),
           "step_cpu_ms": quartiles(steps_cpu), "floor_cpu_ms": quartiles(floors_cpu),
           "ratio_cpu": quartiles(ratios_cpu), "step_ms_all": steps, "floor_ms_all": floors}
    if config_flops is not None:
        row["config_linear_flops"] = config_flops
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--cases", nargs="+", default=["plain", "mtp8:4"])
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="time the compiled step (module doc)")
    ap.add_argument("--engine", nargs="*", default=[], metavar="KEY=VALUE",
                    help="engine settings for both engines, e.g. compile_regions=false")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, {args.threads} threads, "
          f"{platform.processor() or platform.machine()}, {'compiled' if args.compile else 'eager'}")
    print("| batch | case | GFLOP (linear + attention) | config check | step ms (q1-q3) | floor ms (q1-q3) "
          "| step / floor (q1-q3) | step CPU ms | floor CPU ms | step / floor, CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for B in args.batch_sizes:
        for case in args.cases:
            r = bench_case(args.model, B, case, args.context, args.pairs, compile=args.compile,
                           engine=engine_overrides(args.engine))
            rows.append(r)
            fl = r["flops"]
            check = ("" if "config_linear_flops" not in r else
                     f"linear {r['config_linear_flops'] / 1e9:.3f}")
            fmt = lambda q: f"{q[1]:.2f} ({q[0]:.2f}-{q[2]:.2f})"  # noqa: E731
            print(f"| {B} | {case} | {fl['total'] / 1e9:.3f} ({fl['linear'] / 1e9:.3f} + "
                  f"{fl['attention'] / 1e9:.3f}) | {check} | {fmt(r['step_ms'])} | {fmt(r['floor_ms'])} "
                  f"| {fmt(r['ratio'])} | {fmt(r['step_cpu_ms'])} | {fmt(r['floor_cpu_ms'])} "
                  f"| {fmt(r['ratio_cpu'])} |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
