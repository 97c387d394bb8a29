"""Peer comparison: output tokens/s of transformers `generate` and mtpx on the same checkpoint and prompts.

    OMP_NUM_THREADS=1 python tools/compare_hf.py --data gsm8k --num-prompts 8 --max-new-tokens 64

What runs: the checkpoint (default: mtpx's demo, checkpoints/demo, a hybrid target with 8 MTP
modules) is exported without its MTP modules to a temporary Hugging Face folder
(`mtpx.hf.export.export_checkpoint(src, tmp, None, target_only=True)`) that transformers loads
with `AutoModelForCausalLM.from_pretrained(tmp, dtype=float32)`; mtpx loads the original folder
(with its MTP modules). The prompts (`--data builtin|gsm8k`, the first `--num-prompts`) are
tokenized once by the checkpoint's tokenizer and both engines get the same token ids. Every
configuration decodes every prompt greedily for exactly `--max-new-tokens` tokens (eos ignored):
  - transformers greedy: `generate(do_sample=False)` over batches of `--batch-size` prompts (left
    padded, with an attention mask, when prompt lengths differ), and also at batch 1 when
    `--batch-size` > 1;
  - transformers prompt lookup: `generate(prompt_lookup_num_tokens=N)` for each N of
    `--prompt-lookup-num-tokens`, at batch 1 (transformers' prompt lookup is batch-1 only).
    transformers refuses assisted generation (prompt lookup included) for stateful models such
    as Qwen3NextForCausalLM (the demo's architecture): the row then says why, with no number;
  - mtpx: `LLM(checkpoint, spec=S, max_num_seqs=--batch-size).generate(ids,
    SamplingParams(max_tokens=N, ignore_eos=True))` for each S of `--specs` (none, mtp1, mtp8:
    mtp8 drafts with every module of the checkpoint) and each of `--modes` (eager, compiled:
    engine.compile, compiled and warmed up before anything is timed); all prompts in one call,
    at most --batch-size in flight (continuous batching).
Each configuration gets one untimed warm-up (the first prompt, a few tokens), then `--repeats`
timed runs over all prompts, configurations alternating within a repeat. Output tok/s = prompts x
new tokens / wall seconds of the run; the table gives the mean over repeats and the ratio to
transformers greedy at the same batch size.

Greedy tokens are compared with transformers greedy at batch 1 (no padding), per prompt, for every
row; the check that matters is mtpx without speculation against it: a differing prompt is printed
with the first differing step and transformers' top-2 logit gap there. The exit status is 1 when
a prompt differs where that gap is >= --tie-tolerance (not an fp32 near-tie), after the results
are written: results.md (the table) and results.json (every timing, the tokens check, the
environment) in --out, atomically.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402
from mtpx.metrics.stats import aggregate_spec  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402


def _import_bench():
    """tools/bench_hf_generate.py (its _cpu_name, _timed and _first_mismatch), imported by path:
    tools/ is not a package."""
    if "bench_hf_generate" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_hf_generate",
                                                      ROOT / "tools" / "bench_hf_generate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["bench_hf_generate"] = module
    return sys.modules["bench_hf_generate"]


bench = _import_bench()

DEFAULT_CHECKPOINT = ROOT / "checkpoints" / "demo"
# in the data directory (MTPX_DATA_DIR, else conf/config.yaml's data_dir)
DEFAULT_GSM8K = data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl"
SPECS = ("none", "mtp1", "mtp8")
WARMUP_TOKENS = 4


class Config:
    """One row: how to decode all prompts, and its measurements."""

    def __init__(self, engine: str, setting: str, batch: int, run):
        self.engine, self.setting, self.batch, self.run = engine, setting, batch, run
        self.seconds: list[float] = []
        self.tokens: list[list[int]] | None = None
        self.acceptance_length: float | None = None
        self.error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.engine} {self.setting}"


# --------------------------------------------------------------------------------------------------
# the two engines


def hf_generate(hf, prompts: list[list[int]], new: int, batch: int, pad_id: int, **kw) -> list[list[int]]:
    """transformers greedy generate over batches of `batch` prompts (left padded), eos disabled.
    Returns the new tokens of each prompt (exactly `new` each). kw: e.g. prompt_lookup_num_tokens."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        group = prompts[start:start + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        seq = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                          pad_token_id=pad_id, eos_token_id=None, **kw)
        for row in seq[:, width:].tolist():
            if len(row) != new:
                raise RuntimeError(f"transformers generated {len(row)} of {new} tokens")
            out.append(row)
    return out


def mtpx_generate(llm, prompts: list[list[int]], new: int):
    """mtpx greedy generate of all prompts in one call, eos ignored. Returns (tokens, outputs)."""
    from mtpx import SamplingParams

    outs = llm.generate(prompts, SamplingParams(max_tokens=new, ignore_eos=True))
    for o in outs:
        if o.error is not None:
            raise RuntimeError(f"mtpx request {o.index} failed: {o.error}")
    return [list(o.output_token_ids) for o in outs], outs


def _acceptance_length(outs) -> float | None:
    return aggregate_spec(outs).acceptance_length


@torch.no_grad()
def hf_top2_gap(hf, prompt: list[int], output: list[int], step: int) -> float:
    """transformers' top-1 minus top-2 logit at output step `step` (its greedy choice there)."""
    ids = torch.tensor([prompt + output[:step]])
    logits = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
    top = logits.topk(2).values
    return (top[0] - top[1]).item()


# --------------------------------------------------------------------------------------------------
# setup


def load_prompt_ids(encode, data: str, data_path: str | None, num_prompts: int) -> list[list[int]]:
    from mtpx.data.prompts import load_prompts

    cfg = {"name": data}
    if data == "gsm8k":
        cfg["path"] = str(data_path or DEFAULT_GSM8K)
    return [encode(p.text) for p in load_prompts(cfg, num_prompts)]


def _pad_id(tokenizer) -> int:
    lookup = getattr(tokenizer, "token_to_id", None)
    for tok in ("<|pad|>", "<pad>", "<|endoftext|>"):
        i = lookup(tok) if lookup is not None else None
        if i is not None:
            return i
    return 0


def build_configs(hf, llms: dict, args, pad_id: int) -> list[Config]:
    """The rows, in table order: transformers greedy (batch --batch-size, and 1), prompt lookup
    (batch 1), then mtpx for each spec and mode in `llms` ({(spec, "eager" | "compiled"): LLM})."""
    b = args.batch_size
    rows = [Config("transformers", "greedy", b, lambda p, n: (hf_generate(hf, p, n, b, pad_id), None))]
    if b > 1:
        rows.append(Config("transformers", "greedy", 1,
                           lambda p, n: (hf_generate(hf, p, n, 1, pad_id), None)))
    for n_lookup in args.prompt_lookup_num_tokens:
        if n_lookup > 0:
            rows.append(Config("transformers", f"prompt lookup {n_lookup}", 1, lambda p, n, k=n_lookup: (
                hf_generate(hf, p, n, 1, pad_id, prompt_lookup_num_tokens=k), None)))
    for (spec, mode), llm in llms.items():
        setting = "no spec" if spec == "none" else f"{spec} (k={llm.num_speculative_tokens})"
        if mode == "compiled":
            setting += ", compiled"
        rows.append(Config("mtpx", setting, b, lambda p, n, llm=llm: mtpx_generate(llm, p, n)))
    return rows


def run_all(configs: list[Config], prompts: list[list[int]], new: int, repeats: int) -> None:
    for c in configs:
        try:
            c.run(prompts[:1], min(new, WARMUP_TOKENS))
        except (ValueError, NotImplementedError, TypeError) as err:
            c.error = f"not supported by {c.engine}: {err}"
            print(f"  {c.label} (batch {c.batch}): {c.error}", flush=True)
    for i in range(repeats):
        for c in configs:
            if c.error is not None:
                continue
            (tokens, outs), dt = bench._timed(lambda c=c: c.run(prompts, new))
            c.seconds.append(dt)
            if c.tokens is None:
                c.tokens = tokens
                c.acceptance_length = _acceptance_length(outs) if outs is not None else None
            print(f"  repeat {i}: {c.label:<34} batch {c.batch:>3}: "
                  f"{len(prompts) * new / dt:8.1f} tok/s", flush=True)


# --------------------------------------------------------------------------------------------------
# results


def summarize(configs: list[Config], prompts: list[list[int]], new: int) -> list[dict]:
    ref = next((c for c in configs if c.engine == "transformers" and c.setting == "greedy" and c.batch == 1),
               None)
    base = {c.batch: c for c in configs if c.engine == "transformers" and c.setting == "greedy"}
    rows = []
    for c in configs:
        tps = [len(prompts) * new / s for s in c.seconds]
        mean = statistics.fmean(tps) if tps else None
        b = base.get(c.batch)
        b_mean = (statistics.fmean(len(prompts) * new / s for s in b.seconds) if b is not None and b.seconds
                  else None)
        same = None
        if c.tokens is not None and ref is not None and ref.tokens is not None:
            same = sum(x == y for x, y in zip(c.tokens, ref.tokens))
        rows.append({"engine": c.engine, "setting": c.setting, "batch_size": c.batch, "error": c.error,
                     "seconds": c.seconds, "output_tok_per_s": tps, "mean_output_tok_per_s": mean,
                     "ratio_to_transformers_greedy": None if mean is None or not b_mean else mean / b_mean,
                     "acceptance_length": c.acceptance_length,
                     "prompts_identical_to_transformers_greedy": same})
    return rows


def format_table(rows: list[dict], num_prompts: int) -> str:
    lines = ["| engine | setting | batch | output tok/s | vs transformers greedy (same batch) "
             "| acceptance length | greedy tokens = transformers greedy |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        tps = r["output_tok_per_s"]
        if r["error"]:
            speed = "—"
        elif len(tps) > 1:
            speed = f"{statistics.fmean(tps):.1f} ({min(tps):.1f}-{max(tps):.1f})"
        else:
            speed = f"{tps[0]:.1f}"
        ratio = ("—" if r["ratio_to_transformers_greedy"] is None
                 else f"{r['ratio_to_transformers_greedy']:.2f}x")
        acc = "—" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}"
        same = ("—" if r["prompts_identical_to_transformers_greedy"] is None
                else f"{r['prompts_identical_to_transformers_greedy']}/{num_prompts}")
        setting = r["setting"] + (f" ({r['error']})" if r["error"] else "")
        lines.append(f"| {r['engine']} | {setting} | {r['batch_size']} | {speed} | {ratio} | "
                     f"{acc} | {same} |")
    return "\n".join(lines) + "\n"


def check_plain(configs: list[Config], hf, prompts: list[list[int]], tie_tolerance: float) -> dict:
    """mtpx without speculation vs transformers greedy at batch 1, per prompt."""
    ref = next((c for c in configs if c.engine == "transformers" and c.setting == "greedy" and c.batch == 1),
               None)
    mine = next((c for c in configs if c.engine == "mtpx" and c.setting.startswith("no spec")), None)
    if ref is None or mine is None or ref.tokens is None or mine.tokens is None:
        return {"checked": False, "reason": "needs mtpx no spec (--specs none) and transformers greedy"}
    diffs = []
    for i, (a, b) in enumerate(zip(mine.tokens, ref.tokens)):
        if a != b:
            step = next(t for t, (x, y) in enumerate(zip(a, b)) if x != y)
            gap = hf_top2_gap(hf, prompts[i], b, step)
            diffs.append({"prompt": i, "step": step, "mtpx": a[step], "transformers": b[step],
                          "transformers_top2_gap": gap, "near_tie": gap < tie_tolerance,
                          "detail": bench._first_mismatch(torch.tensor([a]), torch.tensor([b]))})
    return {"checked": True, "num_prompts": len(prompts), "identical": len(prompts) - len(diffs),
            "mismatches": diffs, "tie_tolerance": tie_tolerance}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT),
                    help="an mtpx checkpoint folder with MTP modules (default: checkpoints/demo)")
    ap.add_argument("--data", choices=("builtin", "gsm8k"), default="builtin")
    ap.add_argument("--data-path", default=None, help=f"the GSM8K JSONL file (default {DEFAULT_GSM8K})")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1,
                    help="transformers' batch and mtpx's max_num_seqs (prompt lookup always runs at 1)")
    ap.add_argument("--prompt-lookup-num-tokens", type=int, nargs="+", default=[10],
                    help="transformers prompt lookup settings to run (0 = none)")
    ap.add_argument("--specs", nargs="+", choices=SPECS, default=list(SPECS), help="mtpx configurations")
    ap.add_argument("--modes", nargs="+", choices=("eager", "compiled"), default=["eager"],
                    help="mtpx without and/or with engine.compile "
                         "(compiled engines compile and warm up first)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per configuration")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--tie-tolerance", type=float, default=1e-3,
                    help="a differing token where transformers' top-2 logit gap is below this is a near-tie")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "compare_hf"),
                    help="folder for results.md and results.json")
    args = ap.parse_args(argv)
    if min(args.num_prompts, args.max_new_tokens, args.batch_size, args.repeats) < 1:
        ap.error("--num-prompts, --max-new-tokens, --batch-size and --repeats must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    ckpt = Path(args.checkpoint)
    if not (ckpt / "config.json").is_file():
        print(f"error: {ckpt} is not a checkpoint folder (no config.json): pass --checkpoint DIR",
              file=sys.stderr)
        return 2
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("error: transformers is not installed: python -m pip install transformers", file=sys.stderr)
        return 2
    from mtpx import LLM
    from mtpx.hf.export import export_checkpoint

    load_before = os.getloadavg()
    try:
        llms = {(spec, mode): LLM(model=ckpt, spec=None if spec == "none" else spec, dtype="float32",
                                  max_num_seqs=args.batch_size, compile=mode == "compiled")
                for mode in dict.fromkeys(args.modes) for spec in dict.fromkeys(args.specs)}
        llm = next(iter(llms.values()))
        prompts = load_prompt_ids(llm.encode, args.data, args.data_path, args.num_prompts)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    pad_id = _pad_id(llm.tokenizer)
    with tempfile.TemporaryDirectory(prefix="mtpx_compare_hf_") as tmp:
        folder = export_checkpoint(ckpt, Path(tmp) / "hf", None, target_only=True)
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None
        arch = type(hf).__name__
    print(f"{ckpt}: transformers {arch} ({sum(p.numel() for p in hf.parameters()):,} parameters), "
          f"{len(prompts)} {args.data} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{args.max_new_tokens} new tokens, {torch.get_num_threads()} threads", flush=True)
    configs = build_configs(hf, llms, args, pad_id)
    run_all(configs, prompts, args.max_new_tokens, args.repeats)
    rows = summarize(configs, prompts, args.max_new_tokens)
    check = check_plain(configs, hf, prompts, args.tie_tolerance)
    env = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "cpu": bench._cpu_name(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "loadavg_1_5_15min_before": list(load_before), "loadavg_1_5_15min_after": list(os.getloadavg()),
        "checkpoint": str(ckpt), "transformers_architecture": arch, "dtype": "float32",
        "command": " ".join([Path(sys.executable).name]
                            + (sys.argv if argv is None else ["tools/compare_hf.py", *argv])),
    }
    table = format_table(rows, len(prompts))
    if check["checked"]:
        verdict = (f"Greedy tokens, mtpx without speculation vs transformers greedy (batch 1): identical on "
                   f"{check['identical']}/{check['num_prompts']} prompts.")
        for m in check["mismatches"]:
            verdict += (f"\n- prompt {m['prompt']} differs first at step {m['step']}: mtpx {m['mtpx']} vs "
                        f"transformers {m['transformers']}, transformers' top-2 logit gap "
                        f"{m['transformers_top2_gap']:.3g}{' (near-tie)' if m['near_tie'] else ''}")
    else:
        verdict = f"Greedy tokens not checked: {check['reason']}."
    header = (f"{ckpt.name} ({arch} in transformers), {args.data}: {len(prompts)} prompts, "
              f"{args.max_new_tokens} new tokens each (greedy, eos ignored), float32, "
              f"{env['torch_threads']} torch thread(s) on {env['cpu']}; torch {env['torch']}, transformers "
              f"{env['transformers']}; mean of {args.repeats} run(s) after a warm-up, {env['date_utc']}; "
              f"load average (1 min) {load_before[0]:.2f} before, "
              f"{env['loadavg_1_5_15min_after'][0]:.2f} after.")
    out = Path(args.out)
    atomic_write_json(out / "results.json",
                      {"env": env, "args": vars(args), "rows": rows, "greedy_check": check,
                       "prompt_lengths": [len(p) for p in prompts]})
    atomic_write_text(out / "results.md", f"{header}\n\n{table}\n{verdict}\n")
    print()
    print(table, end="")
    print(verdict)
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")
    return 1 if any(not m["near_tie"] for m in check.get("mismatches", [])) else 0


if __name__ == "__main__":
    sys.exit(main())
