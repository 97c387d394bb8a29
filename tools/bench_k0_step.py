"""Automatic k's decode step without drafts against a plain engine's step, side by side.

    OMP_NUM_THREADS=1 python tools/bench_k0_step.py [--model checkpoints/demo] \
        [--batch-sizes 1 4 16 64] [--modes eager compiled] [--steps 30] [--input-len 64] \
        [--kinds held depth0 plain_b] [--out experiments/auto_k_never_loses]

Engines in one process, one thread (torch.set_num_threads(1)): plain decoding, and for each kind
(--kinds): `held`, multi-module MTP with every step at k = 0 and every request held at depth max_k
(the worst case of automatic k's step without drafts: each request's modules fall behind,
mtpx/engine/lazy_catch_up.py); `depth0`, the same engine with depth per request (as automatic k)
and every request admitted at depth 0 (the usual case at a large batch: the step is plain
decoding's, mtpx/engine/model_runner.py); `plain_b`, a second plain engine (an A/A comparison: what
two engines doing the same work read apart). The policies are forced, so their own decision work
is not in the step. For each batch size every engine gets the same random prompts, prefills them,
then runs `steps` decode steps, the engines in an order rotated step by step (`Engine.step`, its
scheduling and bookkeeping included); the table gives each engine's median step ms and the median
of the paired ratios (kind / plain, step by step) with its quartiles. The modules' lag (prompt
positions included: its prefill at k = 0 defers the module prefill too) stays within the catch-up
ring of 256 positions for input_len + steps <= 254, so no catch-up runs in the timed steps.
On this machine an engine built earlier reads slower (2-3% per engine built between them: a plain
engine 6-9% below a second one built three engines later); --build-reversed builds them in the
opposite order, and two calls, one each way, bracket that effect (--bracket FWD.json REV.json: the
geometric means). Writes bench_k0_step.md and .json into --out.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.auto_k import AutoDraftLength  # noqa: E402
from mtpx.core.request import Request  # noqa: E402
from mtpx.engine.malloc import tune_malloc  # noqa: E402
from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402


KINDS = {"held": "automatic k, k = 0, held at depth 8", "depth0": "automatic k, k = 0, at depth 0",
         "plain_b": "a second plain engine"}


def engines(model: str, mode: str, max_num_seqs: int, kinds: list[str], reverse: bool = False) -> dict:
    """{"plain": a plain engine, kind: its engine for each of `kinds` (module doc)}, built in that
    order, or (reverse) the last kind first and plain last."""
    kw = dict(compile=mode == "compiled", max_num_seqs=max_num_seqs)
    out = {}
    for kind in (list(reversed(kinds)) + ["plain"]) if reverse else ["plain"] + kinds:
        if kind in ("plain", "plain_b"):
            out[kind] = LLM(model=model, **kw).engine
            continue
        engine = LLM(model=model, spec="mtp8", **kw).engine
        policy = AutoDraftLength(engine.runner.num_speculative_tokens)
        policy.forced, policy.forced_depth = 0, (policy.max_k if kind == "held" else 0)
        engine.draft_length = engine.scheduler.draft_length = policy
        engine.scheduler.depth_per_request = kind == "depth0"
        out[kind] = engine
    return {name: out[name] for name in ["plain"] + kinds}      # the step rotation's order either way


def paired(engines: dict, batch: int, steps: int, input_len: int, seed: int) -> dict:
    """Median ms of each engine's decode step and each kind's paired ratios to plain at `batch` requests."""
    g = random.Random(seed)
    vocab = engines["plain"].model.cfg.vocab_size
    prompts = [[g.randrange(3, vocab) for _ in range(input_len)] for _ in range(batch)]
    params = SamplingParams(max_tokens=steps + 8, ignore_eos=True)
    for engine in engines.values():
        for i, p in enumerate(prompts):
            engine.add_request(Request(i, list(p), params))
        while any(r.is_prefilling for r in engine.scheduler.running) or engine.scheduler.waiting:
            engine.step()
        engine.step()                                                    # one untimed decode step
    names = list(engines)
    times = {name: [] for name in names}
    for i in range(steps):
        for name in names[i % len(names):] + names[: i % len(names)]:
            t0 = time.perf_counter()
            engines[name].step()
            times[name].append(1e3 * (time.perf_counter() - t0))
    for engine in engines.values():
        for r in list(engine.scheduler.running):
            engine.abort(r)
        while engine.has_unfinished_requests():
            engine.step()
    row = {"batch": batch, "plain_ms": statistics.median(times["plain"])}
    for name in names[1:]:
        ratios = sorted(x / p for x, p in zip(times[name], times["plain"]))
        q = statistics.quantiles(ratios, n=4)
        row[name] = {"ms": statistics.median(times[name]), "ratio": statistics.median(ratios),
                     "ratio_q1": q[0], "ratio_q3": q[2]}
    return row


def bracket(forward: Path, reverse: Path) -> str:
    """The geometric mean of each kind's paired ratio in a call that built plain first (forward
    bench_k0_step.json) and one that built it last (reverse): a build-order effect linear in the
    engine's position cancels (module doc). A markdown table."""
    a, b = (json.loads(Path(p).read_text()) for p in (forward, reverse))
    lines = ["| mode | batch | engine | built plain first | built plain last | geometric mean |",
             "|---|---:|---|---:|---:|---:|"]
    for x, y in zip(a["rows"], b["rows"]):
        for kind in a["meta"]["kinds"]:
            f, r = x[kind]["ratio"], y[kind]["ratio"]
            lines.append(f"| {x['mode']} | {x['batch']} | {KINDS[kind]} | {f:.3f}x | {r:.3f}x | "
                         f"{(f * r) ** 0.5:.3f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--modes", nargs="+", default=["eager"], choices=["eager", "compiled"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--build-reversed", action="store_true",
                    help="build the last kind's engine first, plain's last (module doc)")
    ap.add_argument("--kinds", nargs="+", default=["held", "depth0", "plain_b"], choices=list(KINDS))
    ap.add_argument("--out", default=str(ROOT / "experiments" / "auto_k_never_loses"))
    ap.add_argument("--bracket", nargs=2, type=Path, metavar=("FORWARD.json", "REVERSED.json"),
                    help="print the geometric means of two calls' ratios (bracket) and exit")
    a = ap.parse_args(argv)
    if a.bracket:
        print(bracket(*a.bracket), end="")
        return 0
    if a.steps + a.input_len > 254:
        ap.error("--steps + --input-len at most 254: beyond, the held engine's catch-up ring overflows "
                 "(a catch-up round)")
    torch.set_num_threads(1)
    # glibc's settings of the engines (mtpx/engine/malloc.py) before any model is loaded, so that no
    # engine's weights alone sit in fresh mmap'ed pages (the first one's did)
    tune_malloc()
    rows = []
    for mode in a.modes:
        built = engines(a.model, mode, max(a.batch_sizes), a.kinds, a.build_reversed)
        for b in a.batch_sizes:
            row = {"mode": mode, **paired(built, b, a.steps, a.input_len, seed=b)}
            rows.append(row)
            print(f"{mode:8s} batch {b:3d}: plain {row['plain_ms']:.2f} ms, "
                  + ", ".join(f"{k} {row[k]['ms']:.2f} ms, paired {row[k]['ratio']:.3f}x" for k in a.kinds),
                  flush=True)
    lines = ["| mode | batch | plain step ms | engine | its step ms | paired ratio (q1-q3) |",
             "|---|---:|---:|---|---:|---:|"]
    lines += [f"| {r['mode']} | {r['batch']} | {r['plain_ms']:.2f} | {KINDS[k]} | {r[k]['ms']:.2f} | "
              f"{r[k]['ratio']:.3f}x ({r[k]['ratio_q1']:.3f}-{r[k]['ratio_q3']:.3f}) |"
              for r in rows for k in a.kinds]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"cpu": platform.processor() or platform.machine(), "threads": 1, "steps": a.steps,
            "input_len": a.input_len, "kinds": a.kinds, "build_reversed": a.build_reversed,
            "torch": torch.__version__}
    atomic_write_text(out / "bench_k0_step.md", "\n".join(lines) + "\n")
    atomic_write_json(out / "bench_k0_step.json", {"meta": meta, "rows": rows})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
