"""engine.compile=true against false, side by side in one run: decode tokens/s of one checkpoint
and speculator at several batch sizes.

    python tools/bench_compile.py [--model checkpoints/demo] [--spec mtp8] [--batch-sizes 1 16] \
        [--input-len 64] [--output-len 128] [--repeats 3] [--device cpu] [--dtype float32] \
        [--contenders eager whole regions] [--out experiments/compile_bench]

LLMs share one model: eager, and compiled as one graph ("whole", engine.compile_regions=false)
and with layer regions ("regions", the default), each warmed up first (build times reported
once). For each batch size, `batch` random prompts of input-len tokens generate exactly
output-len tokens (ignore_eos, greedy) with every request in the engine at once; the engines
alternate (the order reversed every round) for `repeats` rounds after one untimed round each.
Decode tokens/s = output tokens after the first of each request / (time from the last first
token to the last finish), i.e. the steady decode phase; output tokens/s over the whole run is
reported beside it, and regions / whole as the median of the per-round ratios. The greedy tokens
of all engines must be identical (exit status 1 otherwise). Writes bench_compile.md and .json into
--out (atomically).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402
from mtpx.metrics.stats import aggregate_spec  # noqa: E402


def _round(llm: LLM, prompts, output_len: int) -> dict:
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    t1 = time.perf_counter()
    first = max(o.first_token_time for o in outs)
    last = max(o.finish_time for o in outs)
    decode_tokens = sum(len(o.output_token_ids) - 1 for o in outs)
    return {"decode_tok_s": decode_tokens / max(last - first, 1e-9),
            "output_tok_s": sum(len(o.output_token_ids) for o in outs) / (t1 - t0),
            "tokens": [o.output_token_ids for o in outs],
            "acceptance_length": aggregate_spec(outs).acceptance_length or 1.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "checkpoints" / "demo"))
    ap.add_argument("--spec", default="mtp8", help="mtp1 | mtp8 | none")
    ap.add_argument("--num-speculative-tokens", type=int, default=None)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--contenders", nargs="+", default=["eager", "whole", "regions"],
                    choices=["eager", "whole", "regions"], help="eager is always included")
    ap.add_argument("--out", default="experiments/compile_bench")
    args = ap.parse_args(argv)
    spec = None if args.spec == "none" else args.spec
    max_seqs = max(args.batch_sizes)
    kw = dict(spec=spec, num_speculative_tokens=args.num_speculative_tokens, max_num_seqs=max_seqs,
              dtype=args.dtype, device=args.device,
              max_model_len=args.input_len + args.output_len + 16)
    eager = LLM(model=args.model, **kw)
    shared = {k: v for k, v in kw.items() if k not in ("dtype", "device")}
    engines, compile_stats = {"eager": eager}, {}
    for name in args.contenders:
        if name == "eager":
            continue
        llm = LLM(model=eager.model, tokenizer=eager.tokenizer, compile=True,
                  compile_regions=name == "regions", **shared)
        engines[name], compile_stats[name] = llm, llm.compile_stats
        cs = llm.compile_stats
        print(f"{name}: built in {cs['compile_s']:.1f} s ({cs['num_graphs']} graphs, mode {cs['mode']})",
              flush=True)
    names = list(engines)
    g = torch.Generator().manual_seed(args.seed)
    vocab = eager.model.cfg.vocab_size
    rows, ok = [], True
    for B in args.batch_sizes:
        prompts = torch.randint(1, vocab, (B, args.input_len), generator=g).tolist()
        for llm in engines.values():
            _round(llm, prompts, args.output_len)                   # untimed
        runs = {n: [] for n in names}
        for i in range(args.repeats):
            for n in (names if i % 2 == 0 else names[::-1]):        # alternated, order reversed each repeat
                runs[n].append(_round(engines[n], prompts, args.output_len))
        same = all(r["tokens"] == runs["eager"][0]["tokens"] for rs in runs.values() for r in rs)
        ok &= same
        med = {n: {m: statistics.median(r[m] for r in rs) for m in ("decode_tok_s", "output_tok_s")}
               for n, rs in runs.items()}
        paired = {}
        if "regions" in runs and "whole" in runs:           # regions / whole per repeat
            ratios = [a["decode_tok_s"] / b["decode_tok_s"] for a, b in zip(runs["regions"], runs["whole"])]
            paired = {"regions_over_whole": statistics.median(ratios),
                      "regions_over_whole_range": [min(ratios), max(ratios)]}
        row = {"batch_size": B, **{n: med[n] for n in names},
               "decode_over_eager": {n: med[n]["decode_tok_s"] / med["eager"]["decode_tok_s"] for n in names},
               **paired,
               "decode_tok_s_runs": {n: [round(r["decode_tok_s"], 1) for r in rs] for n, rs in runs.items()},
               "acceptance_length": runs["eager"][0]["acceptance_length"], "tokens_identical": same}
        rows.append(row)
        print(f"batch {B}: decode tok/s " + ", ".join(f"{n} {med[n]['decode_tok_s']:.1f}" for n in names)
              + (f"; regions / whole {paired['regions_over_whole']:.3f}" if paired else "")
              + f"; tokens identical: {same}", flush=True)
    result = {"model": args.model, "spec": args.spec, "num_speculative_tokens": eager.num_speculative_tokens,
              "device": args.device, "dtype": args.dtype, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "platform": platform.platform(), "input_len": args.input_len,
              "output_len": args.output_len, "repeats": args.repeats, "compile": compile_stats, "rows": rows}
    lines = [f"# engine.compile on vs off ({args.spec}, k={eager.num_speculative_tokens}, {args.device}, "
             f"{args.dtype}, {torch.get_num_threads()} threads, torch {torch.__version__})", "",
             f"{args.input_len}-token random prompts, exactly {args.output_len} output tokens, greedy, "
             f"all requests at once; medians of {args.repeats} alternating repeats. Contenders: eager; "
             "whole (engine.compile_regions=false: the step as one graph, C++ wrapper); regions "
             "(engine.compile_regions=true: one compiled region per layer type, Python wrapper). Build: "
             + "; ".join(f"{n} {cs['compile_s']:.1f} s, {cs['num_graphs']} graphs"
                         for n, cs in compile_stats.items())
             + ".", "",
             "| batch | " + " | ".join(f"{n} decode tok/s" for n in names) + " | "
             + " | ".join(f"{n} / eager" for n in names if n != "eager")
             + (" | regions / whole (paired median, range)" if "regions" in names and "whole" in names
                else "")
             + " | acceptance length | tokens identical |",
             "|---:|" + "---:|" * (2 * len(names) - 1 + ("regions" in names and "whole" in names))
             + "---:|:---:|"]
    for r in rows:
        cells = [f"{r[n]['decode_tok_s']:.1f}" for n in names]
        cells += [f"{r['decode_over_eager'][n]:.2f}x" for n in names if n != "eager"]
        if "regions_over_whole" in r:
            lo, hi = r["regions_over_whole_range"]
            cells.append(f"{r['regions_over_whole']:.3f} ({lo:.3f}-{hi:.3f})")
        lines.append(f"| {r['batch_size']} | " + " | ".join(cells)
                     + f" | {r['acceptance_length']:.2f} | {'yes' if r['tokens_identical'] else 'NO'} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench_compile.md", "\n".join(lines) + "\n")
    atomic_write_json(out / "bench_compile.json", result)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
