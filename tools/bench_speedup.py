"""Speculation against plain decoding on real prompts, side by side in one run: output tokens/s of
plain decoding, mtp1, mtp8 (and other k, and the automatic k) on the same GSM8K test prompts.

    python tools/bench_speedup.py [--model checkpoints/demo] [--num-prompts 128] [--max-tokens 256] \
        [--contenders plain mtp1 mtp8 auto] [--concurrency 1] [--rounds 4] [--compile] \
        [--threads 2] [--interleave 4] [--build-reversed] [--isolate] [--out experiments/speedup_gsm8k]

One LLM per contender (`plain`, `mtp1` = single-module MTP with k = 1, `mtp8` = multi-module MTP
with k = 8; `mtpK` or `mtp8:K` for another k of multi-module MTP; `auto` = multi-module MTP with
num_speculative_tokens=auto, its step costs calibrated at start-up or loaded from the step-cost
cache of an earlier run with the same settings (mtpx.engine.llm.LLM; the source is reported);
`NAME+key=value` adds an engine setting, e.g. `auto+ragged_batch=false`), each
with max_num_seqs = --concurrency and at most that many requests in the engine at once, greedy,
at most --max-tokens each, eos ends a request. With
--compile every engine compiles its decode step and warms up before anything is timed. The first
--num-prompts GSM8K test questions (formatted as the eval formats them) are cut into --rounds
chunks; with --interleave 0 every contender generates each chunk in turn, in an order rotated per
chunk (by default the engines' steps are interleaved instead, below). Output tokens/s of a
contender = its output tokens / its seconds (generate wall time, or its steps'), over all chunks; the ratio
to plain is given over all chunks and its min-max over the chunks. Every contender's greedy
tokens are compared with plain decoding's (mismatches are counted and reported; on fp32 a
near-tie may flip a token). Writes speedup.json and speedup.md into --out atomically.

--interleave N (default 4; 0: whole generates rotated per chunk, as described above): for each chunk,
every contender's engine gets all of the chunk's requests (Engine.add_request; at most
--concurrency in the engine at once, as LLM.generate's client admits them), and the engines are
stepped round-robin, N steps each per turn, the order rotated by one each turn; a contender's
seconds are the sum of its `Engine.step` calls (with the admissions before each), timed with
perf_counter. Left out: encoding the prompts and decoding the outputs (the same prompts and tokens
for every contender; their seconds are reported as host_s). A drift of the machine over seconds
then lands on every contender alike, where a whole generate of several seconds may catch it alone
(two plain engines read 0.989x-1.032x apart interleaved, 0.919x-1.215x per chunk).
A contender named NAME_TAG (e.g. plain_b) is NAME again, a second engine: an A/A comparison.
On this machine an engine built earlier in the process runs its steps slower than one built later
(2-3% per engine built between them, eager and compiled, the same kind of engine either way:
experiments/auto_k_never_loses); --build-reversed builds them from the last contender to the first
(the timing order stays the contenders'), so that two runs, one each way, bracket the effect.
--isolate: every contender's engine in a process of its own (spawned; tools/bench_contenders.py),
built one after another, the driver stepping them in turn as above (one process runs at a time);
each process loads the model itself. The build-order effect above survives it (it lies outside the
process: experiments/auto_k_never_loses, section 6), so bracket with --build-reversed either way.
--share-weights: the contenders' engines run over one model loaded once (each engine keeps its own
KV cache, states and graphs), so that no contender's weights sit elsewhere in memory and caches;
automatic k's calibration is then kept in a file of the step-cost cache for the next run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "tools"))  # bench_contenders

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402
from mtpx.engine.precompile import _source_hash  # noqa: E402
from mtpx.hf.loader import load_pretrained  # noqa: E402
from mtpx.engine.malloc import tune_malloc  # noqa: E402
from mtpx.io import atomic_write_json, atomic_write_text, mtpx_cache_dir  # noqa: E402
from mtpx import auto_k  # noqa: E402
from mtpx.auto_k.costs import step_costs  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402

from bench_contenders import Contender, IsolatedContender, run_chunk  # noqa: E402

GSM8K_TEST = data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl"   # MTPX_DATA_DIR or conf/config.yaml data_dir


def _overrides(name: str) -> tuple[str, dict]:
    """'auto+ragged_batch=false' -> ("auto", {"ragged_batch": False}): engine settings after '+'
    (EngineConfig keys; true/false, integers and [lists] parsed), so one run can compare a contender with
    and without one."""
    base, *pairs = name.split("+")
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if value.startswith("["):                      # a list: auto+compile_depths=[0,4,8]
            out[key] = json.loads(value)
        else:
            number = int(value) if value.lstrip("-").isdigit() else value
            out[key] = {"true": True, "false": False}.get(value.lower(), number)
    return base, out


def _contender(name: str) -> tuple[str | None, int | None]:
    """'plain' -> (None, None); 'mtp1' -> ("mtp1", 1); 'mtpK' -> ("mtp8", K); 'auto' -> ("mtp8", "auto");
    'NAME_TAG' -> NAME's (a second engine of the same kind)."""
    name = _overrides(name)[0].split("_")[0]
    if name == "plain":
        return None, None
    if name == "auto":
        return "mtp8", "auto"
    if name == "mtp1":
        return "mtp1", 1
    if name.startswith("mtp") and name[3:].isdigit():
        return "mtp8", int(name[3:])
    if name.startswith("mtp8:") and name[5:].isdigit():     # mtp8:1 = multi-module MTP with k = 1
        return "mtp8", int(name[5:])
    raise SystemExit(f"error: contender {name!r}: use plain, mtp1, mtpK (multi-module MTP, k = K) or auto")


def _engine_time(timings, llm) -> dict:
    """Where a contender's generate time went, from its engine's StepTimings over every chunk:
    seconds in prefill and in decode steps, and the median decode step (ms) at each batch size
    over the pure decode steps that verified a full k drafts per request (fixed k; every k for
    the automatic one), for the cost model's check (experiments/auto_k/predict.py)."""
    auto = auto_k.summary(llm.engine.draft_length) is not None
    ks = range(llm.num_speculative_tokens + 1) if auto else [llm.num_speculative_tokens]
    steady = {k: {b: round(c["step_ms"], 4) for b, c in step_costs(timings, k).items()} for k in ks}
    return {"prefill_s": round(sum(t.prefill_s for t in timings), 3),
            "decode_s": round(sum(t.verify_s + t.draft_s for t in timings), 3),
            "steps": len(timings),
            "step_ms": {str(k): {str(b): ms for b, ms in v.items()} for k, v in steady.items() if v}}


def _calibration_note(cal: dict) -> str:
    if cal["source"].startswith("loaded from"):
        return f"; step costs {cal['source']} (a calibration of an earlier run)"
    return f"; step costs calibrated in {cal['seconds']:.1f} s"


def _cost_file(args, name: str) -> Path:
    """--share-weights: where automatic k's calibration is kept between runs of the same settings (an
    engine over an in-memory model has no step-cost cache of its own): a file under the step-cost
    cache keyed by the checkpoint, the settings, the contender and mtpx's source."""
    key = json.dumps([str(Path(args.model).resolve()), args.concurrency, args.compile, args.threads, name,
                      torch.__version__, _source_hash()])
    folder = mtpx_cache_dir() / "step_costs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"bench_speedup-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def _build(args, shared, name: str) -> Contender:
    """Build one contender's engine (with --compile, LLM() compiles and warms it up)."""
    spec, k = _contender(name)
    t0 = time.perf_counter()
    model = args.model if shared is None else shared[0]
    extra = {} if shared is None else {"tokenizer": shared[1], "cost_model_file": _cost_file(args, name)}
    if k != "auto":
        extra.pop("cost_model_file", None)
    llm = LLM(model=model, spec=spec, num_speculative_tokens=k, max_num_seqs=args.concurrency,
              compile=args.compile, max_model_len=1024, **extra, **_overrides(name)[1])
    return Contender(llm, _engine_time, time.perf_counter() - t0 if args.compile else None)


def _build_isolated(args, name: str) -> Contender:
    """--isolate: a worker process's setup, as main's, then its one engine."""
    torch.set_num_threads(args.threads)
    tune_malloc()
    return _build(args, None, name)


def _build_all(args) -> dict:
    """-> {name: Contender or IsolatedContender}, built in the build order, keyed in the contenders'."""
    shared = load_pretrained(args.model) if args.share_weights else None       # (model, tokenizer)
    built = {}
    for name in reversed(args.contenders) if args.build_reversed else args.contenders:
        built[name] = (IsolatedContender((__file__, "_build_isolated", args), name) if args.isolate
                       else _build(args, shared, name))
        if built[name].compile_s is not None:
            print(f"{name}: compiled and warmed up in {built[name].compile_s:.1f} s", flush=True)
        if built[name].calibration is not None:
            cal = built[name].calibration
            print(f"{name}: step costs {cal['source']} ({cal['seconds']:.1f} s)", flush=True)
    return {name: built[name] for name in args.contenders}         # timed in the contenders' order either way


def _row(name: str, per: dict, report: dict, contender) -> dict:
    """One contender's row of speedup.json: its tok/s, its ratios to plain (over all chunks, per chunk),
    acceptance, tokens differing from plain decoding's, and its engine's report."""
    p, plain = per[name], per["plain"]
    ratios = [(x["tokens"] / x["seconds"]) / (y["tokens"] / y["seconds"])
              for x, y in zip(p["chunks"], plain["chunks"])]
    row = {"contender": name, "output_tokens": p["tokens"], "seconds": round(p["seconds"], 3),
           "output_tok_s": p["tokens"] / p["seconds"],
           "ratio_to_plain": (p["tokens"] / p["seconds"]) / (plain["tokens"] / plain["seconds"]),
           "ratio_min": min(ratios), "ratio_max": max(ratios), "ratio_median": statistics.median(ratios),
           "acceptance_length": None if name == "plain" else report["acceptance_length"],
           "mismatches_vs_plain": sum(a != b for a, b in zip(p["token_ids"], plain["token_ids"])),
           "compile_s": contender.compile_s, "host_s": round(p["host_s"], 4),
           "chunks": p["chunks"], "engine_time": report["engine_time"]}
    if report["auto_k"] is not None:
        row["auto_k"] = report["auto_k"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--data", default=str(GSM8K_TEST))
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--contenders", nargs="+", default=["plain", "mtp1", "mtp8"])
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="experiments/speedup_gsm8k")
    ap.add_argument("--build-reversed", action="store_true",
                    help="build the engines from the last contender to the first (module doc)")
    ap.add_argument("--share-weights", action="store_true",
                    help="every contender's engine over one model in memory (module doc)")
    ap.add_argument("--interleave", type=int, default=4, metavar="N",
                    help="time N engine steps per contender in turn (module doc); 0: generates per chunk")
    ap.add_argument("--isolate", action="store_true",
                    help="every contender's engine in a process of its own (module doc)")
    args = ap.parse_args(argv)
    if args.isolate and args.share_weights:
        raise SystemExit("error: --isolate and --share-weights exclude each other (one model cannot span "
                         "processes); drop one")
    if "plain" not in args.contenders:
        raise SystemExit("error: --contenders must include plain (the baseline)")
    torch.set_num_threads(args.threads)
    # glibc's settings of the engines (mtpx/engine/malloc.py) before any model is loaded, so that no
    # engine's weights alone sit in fresh mmap'ed pages (the first one's did)
    tune_malloc()
    prompts = [format_prompt(r["question"]) for r in load_gsm8k(args.data)[: args.num_prompts]]
    chunks = [prompts[i:: args.rounds] for i in range(args.rounds)]
    if len(chunks[-1]) < args.concurrency:   # a chunk is generated alone: its size bounds the batch
        print(f"warning: --num-prompts / --rounds = {len(chunks[-1])} prompts per chunk, below --concurrency "
              f"{args.concurrency}: no more than {len(chunks[-1])} requests run at once; use --num-prompts "
              f">= {args.concurrency * args.rounds}", flush=True)
    params = SamplingParams(max_tokens=args.max_tokens)
    contenders = _build_all(args)
    try:
        per = {n: {"tokens": 0, "seconds": 0.0, "chunks": [], "token_ids": [], "host_s": 0.0}
               for n in args.contenders}
        for c, chunk in enumerate(chunks):
            results = run_chunk(contenders, chunk, params, c, args.concurrency, args.interleave)
            for name, res in results.items():
                p = per[name]
                p["tokens"] += res["tokens"]
                p["seconds"] += res["seconds"]
                p["host_s"] += res["host_s"]
                p["chunks"].append({"tokens": res["tokens"], "seconds": res["seconds"]})
                p["token_ids"].extend(res["token_ids"])
                print(f"chunk {c}: {name} {res['tokens'] / res['seconds']:.1f} tok/s", flush=True)
        reports = {name: contender.report() for name, contender in contenders.items()}
    finally:
        for contender in contenders.values():
            if isinstance(contender, IsolatedContender):
                contender.close()
    rows = [_row(name, per, reports[name], contenders[name]) for name in args.contenders]
    lines = [f"# Output tok/s against plain decoding, same run ({Path(args.model).name}, "
             f"{args.num_prompts} GSM8K test prompts, concurrency {args.concurrency}, "
             f"max {args.max_tokens} tokens, "
             f"{'compiled' if args.compile else 'eager'}, {args.threads} threads, "
             + (f"{args.interleave} steps interleaved" if args.interleave else "generates rotated per chunk")
             + ")", "",
             "| contender | output tok/s | vs plain (chunk min-max) | median of the chunks' ratios | "
             "acceptance length | output tokens | requests differing from plain |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        al = "—" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}"
        lines.append(f"| {r['contender']} | {r['output_tok_s']:.1f} | {r['ratio_to_plain']:.2f}x "
                     f"({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | {r['ratio_median']:.2f}x | {al} | "
                     f"{r['output_tokens']:,d} | {r['mismatches_vs_plain']} |")
    names = [r["contender"] for r in rows]
    if "mtp1" in names and "mtp8" in names:
        r1, r8 = rows[names.index("mtp1")], rows[names.index("mtp8")]
        lines += ["", f"mtp8 / mtp1: {r8['output_tok_s'] / r1['output_tok_s']:.2f}x"]
    for r in rows:
        if "auto_k" in r:
            hist = r["auto_k"]["k_histogram"]
            total = sum(hist.values()) or 1
            fixed = [x for x in rows if "auto_k" not in x]
            best = max(fixed, key=lambda x: x["output_tok_s"])
            paired = statistics.median(x["tokens"] / x["seconds"] / (y["tokens"] / y["seconds"])
                                       for x, y in zip(r["chunks"], best["chunks"]))
            ratio = r["output_tok_s"] / best["output_tok_s"]
            lines += ["", f"{r['contender']}: {ratio:.2f}x the best fixed contender ({best['contender']}; "
                      f"median over chunks of the paired ratio {paired:.2f}x); "
                      "k per decode step (% of steps): "
                      + ", ".join(f"{k}: {100 * n / total:.1f}" for k, n in hist.items())
                      + "; depth per request (requests): "
                      + (", ".join(f"{d}: {n}" for d, n in r["auto_k"].get("depth_histogram", {}).items())
                         or "—")
                      + _calibration_note(r["auto_k"]["calibration"])]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "speedup.json", {"args": vars(args), "platform": platform.platform(),
                                             "torch": torch.__version__, "rows": rows})
    atomic_write_text(out / "speedup.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
