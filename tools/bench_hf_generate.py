"""Greedy decoding throughput, mtpx (no speculation) vs Hugging Face transformers, same checkpoint.

    OMP_NUM_THREADS=1 python tools/bench_hf_generate.py --batch-sizes 1 16 --prompt-len 256 \\
        --max-new-tokens 128 --repeats 5 --threads 2 --out experiments/hf_generate_bench

What is measured: the tiny Qwen3-Next MoE checkpoint of tests/hf_models.py (vocab 512, hidden
64, 4 layers: Gated DeltaNet, gated attention, Gated DeltaNet, gated attention; 4 experts top-2
plus a shared expert in layer 1, dense SwiGLU elsewhere; random weights perturbed with seeded
noise) is written once with transformers' `save_pretrained` into a temporary folder. For every
batch size B, B random prompts of `--prompt-len` tokens are decoded greedily for exactly
`--max-new-tokens` tokens (eos ignored), end to end (prefill + decode), by
  - mtpx: `mtpx.LLM(model=folder, dtype="float32", max_num_seqs=B).generate(token ids,
    SamplingParams(max_tokens=N, ignore_eos=True))` (no speculation: the checkpoint has no MTP
    heads), and
  - transformers: `Qwen3NextForCausalLM.from_pretrained(folder, dtype=float32).generate(ids,
    do_sample=False, max_new_tokens=N)` with eos disabled (its default experts kernel unless
    --hf-experts-implementation; without `flash-linear-attention`/`causal-conv1d` installed it
    runs their reference PyTorch fallbacks, as on any CPU).
One untimed warm-up run per engine, then `--repeats` timed runs alternating mtpx and
transformers. Output tok/s = B * N / wall seconds of one generate call; the table gives the
mean (and min-max) per engine and the ratio mtpx / transformers of the means, all from one run
of this script. Every run's greedy tokens are compared between the engines; the script prints
the first mismatch and exits with status 1 if any differ (after writing the results).

Writes `results.json` (every timing, the environment) and `results.md` (the table) into --out,
atomically. The tiny model builder lives in tests/hf_models.py (shared with the parity tests);
this script puts the repository root on sys.path to import it as `tests.hf_models`.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _hf_generate(hf, ids: torch.Tensor, new: int) -> torch.Tensor:
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                      max_new_tokens=new, pad_token_id=0, eos_token_id=None)
    return out[:, ids.shape[1]:]


def _mtpx_generate(llm, ids: torch.Tensor, new: int) -> torch.Tensor:
    from mtpx import SamplingParams
    outs = llm.generate([p.tolist() for p in ids], SamplingParams(max_tokens=new, ignore_eos=True))
    for o in outs:
        if o.error is not None:
            raise RuntimeError(f"mtpx request {o.index} failed: {o.error}")
    return torch.tensor([list(o.output_token_ids) for o in outs])


def _first_mismatch(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if a.shape != b.shape:
        return f"shapes differ: mtpx {tuple(a.shape)} vs transformers {tuple(b.shape)}"
    bad = (a != b).nonzero()
    if len(bad) == 0:
        return None
    r, t = bad[0].tolist()
    return (f"prompt {r}, step {t}: mtpx {a[r, t].item()} vs transformers {b[r, t].item()} "
            f"({len(bad)} differing tokens in {a.numel()})")


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench_batch(folder: Path, hf, batch: int, prompt_len: int, new: int, repeats: int,
                seed: int) -> dict:
    from mtpx import LLM
    from tests.hf_models import hf_greedy, min_top2_gap

    g = torch.Generator().manual_seed(seed + batch)
    ids = torch.randint(0, hf.config.vocab_size, (batch, prompt_len), generator=g)
    llm = LLM(model=str(folder), dtype="float32", max_num_seqs=batch,
              max_model_len=prompt_len + new + 1)
    # warm-up (untimed); transformers' warm-up also returns the per-step logits for the tie margin
    ref, logits = hf_greedy(hf, ids, new)
    mine = _mtpx_generate(llm, ids, new)
    mismatches = []
    if (m := _first_mismatch(mine, ref)) is not None:
        mismatches.append(f"warm-up: {m}")
    times = {"mtpx": [], "transformers": []}
    for i in range(repeats):
        out, dt = _timed(lambda: _mtpx_generate(llm, ids, new))
        times["mtpx"].append(dt)
        if (m := _first_mismatch(out, ref)) is not None:
            mismatches.append(f"repeat {i} mtpx: {m}")
        out, dt = _timed(lambda: _hf_generate(hf, ids, new))
        times["transformers"].append(dt)
        if (m := _first_mismatch(mine, out)) is not None:
            mismatches.append(f"repeat {i} transformers: {m}")
        print(f"  batch {batch} repeat {i}: mtpx {batch * new / times['mtpx'][-1]:.1f} tok/s, "
              f"transformers {batch * new / dt:.1f} tok/s", flush=True)
    tps = {k: [batch * new / t for t in v] for k, v in times.items()}
    mean = {k: statistics.fmean(v) for k, v in tps.items()}
    median = {k: statistics.median(v) for k, v in tps.items()}
    return {
        "batch_size": batch, "prompt_len": prompt_len, "max_new_tokens": new, "repeats": repeats,
        "seconds": times, "output_tok_per_s": tps, "mean_output_tok_per_s": mean,
        "median_output_tok_per_s": median,
        "ratio_mtpx_over_transformers": mean["mtpx"] / mean["transformers"],
        "tokens_identical": not mismatches, "mismatches": mismatches,
        "min_top2_logit_gap": min_top2_gap(logits),
    }


def format_table(rows: list[dict]) -> str:
    lines = ["| batch | prompt / new tokens | mtpx tok/s (min-max) | transformers tok/s (min-max) "
             "| mtpx / transformers | greedy tokens identical |",
             "| ---: | :---: | ---: | ---: | ---: | :---: |"]
    for r in rows:
        cells = []
        for k in ("mtpx", "transformers"):
            v = r["output_tok_per_s"][k]
            cells.append(f"{statistics.fmean(v):.1f} ({min(v):.1f}-{max(v):.1f})")
        lines.append(f"| {r['batch_size']} | {r['prompt_len']} / {r['max_new_tokens']} | {cells[0]} "
                     f"| {cells[1]} | {r['ratio_mtpx_over_transformers']:.2f}x "
                     f"| {'yes' if r['tokens_identical'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per engine and batch size")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "hf_generate_bench"),
                    help="folder for results.json and results.md")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: leave torch's setting)")
    ap.add_argument("--seed", type=int, default=0, help="model and prompt seed")
    ap.add_argument("--hf-experts-implementation", default=None,
                    help="transformers' MoE experts kernel (eager, grouped_mm, ...; default: its own)")
    ap.add_argument("--checkpoint", default=None,
                    help="write the tiny checkpoint here (default: a temporary folder, removed after)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.prompt_len < 1 or args.max_new_tokens < 1 or min(args.batch_sizes) < 1:
        ap.error("--repeats, --prompt-len, --max-new-tokens and --batch-sizes must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    from tests.hf_models import build_qwen3_next_moe, qwen3_next_moe_config

    load_before = os.getloadavg()
    tmp = None
    if args.checkpoint is None:
        tmp = tempfile.TemporaryDirectory(prefix="mtpx_hf_bench_")
        folder = Path(tmp.name)
    else:
        folder = Path(args.checkpoint)
    try:
        folder, hf = build_qwen3_next_moe(folder, seed=args.seed,
                                          experts_implementation=args.hf_experts_implementation)
        print(f"checkpoint {folder} ({sum(p.numel() for p in hf.parameters()):,} parameters), "
              f"{torch.get_num_threads()} threads", flush=True)
        rows = [bench_batch(folder, hf, b, args.prompt_len, args.max_new_tokens, args.repeats, args.seed)
                for b in args.batch_sizes]
    finally:
        if tmp is not None:
            tmp.cleanup()

    env = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1_5_15min_before": list(load_before), "loadavg_1_5_15min_after": list(os.getloadavg()),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "hf_experts_implementation": getattr(hf.config, "_experts_implementation", None),
        "hf_attn_implementation": getattr(hf.config, "_attn_implementation", None),
        "dtype": "float32", "model_config": qwen3_next_moe_config().to_dict(),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
    }
    table = format_table(rows)
    out = Path(args.out)
    atomic_write_json(out / "results.json", {"env": env, "results": rows})
    atomic_write_text(out / "results.md", (
        f"Greedy decoding, tiny Qwen3-Next MoE checkpoint, float32, {env['torch_threads']} torch "
        f"thread(s) on {env['cpu']}; torch {env['torch']}, transformers {env['transformers']} "
        f"(experts: {env['hf_experts_implementation']}); mean of {args.repeats} alternating "
        f"repeats after one warm-up, {env['date_utc']}; load average (1 min) "
        f"{load_before[0]:.2f} before, {env['loadavg_1_5_15min_after'][0]:.2f} after.\n\n" + table))
    print()
    print(table, end="")
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")
    bad = [m for r in rows for m in r["mismatches"]]
    if bad:
        print("GREEDY TOKENS DIFFER between mtpx and transformers:", *bad, sep="\n  ", file=sys.stderr)
        return 1
    print("greedy tokens identical between mtpx and transformers in every run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
