"""Where an engine step's time goes, per contender: perf_counter wrappers around Engine.step's parts
(the scheduler's schedule and update_from_output, the runner's execute and release) and, inside
them, the draft-length policy's entry points (plan, decide_depth, decide, observe), the scheduler's
admissions (_admit) and the runner's prefill, decode and verify forward; the contenders' engines
in one process, their steps interleaved as tools/bench_speedup.py --interleave does (its
bench_contenders.run_chunk). Prints ms per step of each part per engine, split into steps with a prefill
and decode-only steps, and writes them as JSON.

    tools/bench_core.sh python tools/profile_step_parts.py --concurrency 64 --num-prompts 128 \
        --max-tokens 64 --contenders plain auto [--build-reversed] [--out /tmp/parts.json]

Nested parts are inside their parent's time (plan inside schedule, observe inside
update_from_output); "outside" is the step's time that no top-level part covers, "add" the
admissions (Engine.add_request) before each step that bench_speedup's timing includes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import torch  # noqa: E402

import bench_speedup as bs  # noqa: E402
from bench_contenders import Contender, run_chunk  # noqa: E402
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.engine.malloc import tune_malloc  # noqa: E402

TOP = ("schedule", "execute", "update_from_output", "release")


class Parts:
    """One engine's accumulated seconds per part, per kind of step ("prefill": the step has one)."""

    def __init__(self):
        self.cur = defaultdict(float)
        self.total = {"prefill": defaultdict(float), "decode": defaultdict(float)}
        self.steps = {"prefill": 0, "decode": 0}
        self.has_prefill = False
        self.work = defaultdict(int)      # what the steps did: counts

    def wrap(self, obj, name: str, part: str) -> None:
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cur[part] += time.perf_counter() - t0
        setattr(obj, name, timed)

    def end_step(self) -> None:
        kind = "prefill" if self.has_prefill else "decode"
        self.steps[kind] += 1
        for part, s in self.cur.items():
            self.total[kind][part] += s
        self.cur.clear()


def instrument(engine) -> Parts:
    p = Parts()
    sched, runner = engine.scheduler, engine.runner
    schedule = sched.schedule

    def timed_schedule():
        out = schedule()
        p.has_prefill = bool(out.prefills)
        p.work["steps with k > 0"] += out.num_speculative_tokens > 0
        items = out.prefills + out.decodes
        p.work["scheduled items at depth > 0"] += sum(x.request.draft_depth > 0 for x in items)
        p.work["prefills at depth > 0"] += sum(x.request.draft_depth > 0 for x in out.prefills)
        p.work["prefill tokens"] += sum(x.num_tokens for x in out.prefills)
        return out
    sched.schedule = timed_schedule
    p.wrap(sched, "schedule", "schedule")
    p.wrap(sched.draft_length, "plan", "schedule/plan")
    for name in ("decide_depth", "decide", "allocate"):
        if hasattr(sched.draft_length, name):
            p.wrap(sched.draft_length, name, f"schedule/plan/{name}")
    p.wrap(sched, "_admit", "schedule/_admit")
    p.wrap(runner, "execute", "execute")
    p.wrap(runner, "_prefill", "execute/_prefill")
    p.wrap(runner, "_decode", "execute/_decode")
    p.wrap(runner.step, "verify", "execute/_decode/verify")
    p.wrap(runner, "_draft_batch", "execute/_draft_batch")
    if runner.lazy is not None:
        p.wrap(runner.lazy, "prefill", "execute/_prefill/lazy.prefill")
    target, t0 = runner.model.model, []
    target.register_forward_pre_hook(lambda *a: t0.append(time.perf_counter()))

    def after(*a):
        p.cur["execute/target forward"] += time.perf_counter() - t0.pop()
    target.register_forward_hook(after)
    p.wrap(sched, "update_from_output", "update_from_output")
    p.wrap(sched.draft_length, "observe", "update_from_output/observe")
    p.wrap(runner, "release", "release")
    step, add = engine.step, engine.add_request

    def timed_step():
        t0 = time.perf_counter()
        try:
            return step()
        finally:
            p.cur["step"] += time.perf_counter() - t0
            p.end_step()

    def timed_add(r):
        t0 = time.perf_counter()
        try:
            return add(r)
        finally:
            p.cur["add"] += time.perf_counter() - t0
    engine.step, engine.add_request = timed_step, timed_add
    return p


def table(parts: dict) -> tuple[str, dict]:
    names = list(parts)
    rows, data = [], {}
    for kind in ("prefill", "decode", "all"):
        kinds = ("prefill", "decode") if kind == "all" else (kind,)
        steps = {n: sum(parts[n].steps[k] for k in kinds) for n in names}
        ms = {n: defaultdict(float) for n in names}
        for n in names:
            for k in kinds:
                for part, s in parts[n].total[k].items():
                    ms[n][part] += 1e3 * s / max(1, steps[n])
            ms[n]["outside"] = ms[n]["step"] - sum(ms[n][t] for t in TOP)
        keys = ["step", *TOP, "outside", "add"] + sorted({k for n in names for k in ms[n]} - set(TOP)
                                                          - {"step", "outside", "add"})
        rows.append(f"\n{kind} steps: " + ", ".join(f"{n} {steps[n]}" for n in names))
        base = names[0]
        rows.append("| part | " + " | ".join(f"{n} ms/step" for n in names)
                    + " | " + " | ".join(f"{n} - {base} (ms, % of {base}'s step)" for n in names[1:]) + " |")
        rows.append("|---|" + "---:|" * (2 * len(names) - 1))
        for key in keys:
            d = [ms[n][key] - ms[base][key] for n in names[1:]]
            rows.append(f"| {key} | " + " | ".join(f"{ms[n][key]:.3f}" for n in names) + " | "
                        + " | ".join(f"{x:+.3f} ({100 * x / ms[base]['step']:+.2f}%)" for x in d) + " |")
        data[kind] = {"steps": steps, "ms": {n: dict(ms[n]) for n in names}}
    return "\n".join(rows), data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--data", default=str(bs.GSM8K_TEST))
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="chunks of the prompts, one after the other")
    ap.add_argument("--contenders", nargs="+", default=["plain", "auto"])
    ap.add_argument("--interleave", type=int, default=4)
    ap.add_argument("--build-reversed", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tune_malloc()
    prompts = [format_prompt(r["question"]) for r in load_gsm8k(args.data)[: args.num_prompts]]
    chunks = [prompts[i:: args.rounds] for i in range(args.rounds)]
    params = SamplingParams(max_tokens=args.max_tokens)
    llms = {}
    for name in reversed(args.contenders) if args.build_reversed else args.contenders:
        spec, k = bs._contender(name)
        llms[name] = LLM(model=args.model, spec=spec, num_speculative_tokens=k, max_num_seqs=args.concurrency,
                         compile=False, max_model_len=1024, **bs._overrides(name)[1])
    llms = {n: llms[n] for n in args.contenders}
    parts = {n: instrument(llm.engine) for n, llm in llms.items()}
    contenders = {n: Contender(llm, bs._engine_time) for n, llm in llms.items()}
    outs = {n: [] for n in llms}
    for c, chunk in enumerate(chunks):
        res = run_chunk(contenders, chunk, params, c, args.concurrency, args.interleave)
        for n, r in res.items():
            outs[n] += r["token_ids"]
            print(f"chunk {c}: {n} {r['tokens'] / r['seconds']:.1f} tok/s", flush=True)
    for n in llms:
        t = contenders[n].timings
        parts[n].work["prefill module tokens"] = sum(x.num_prefill_module_tokens for x in t)
        parts[n].work["catch-up module tokens"] = sum(x.num_catch_up_module_tokens for x in t)
        print(f"{n}: " + ", ".join(f"{k} {v}" for k, v in parts[n].work.items()))
    base = args.contenders[0]
    same = {n: outs[n] == outs[base] for n in llms}
    text, data = table(parts)
    print(text)
    print("outputs equal to " + base + "'s: " + ", ".join(f"{n} {v}" for n, v in same.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "same": same,
                                              "work": {n: parts[n].work for n in llms}, **data}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
