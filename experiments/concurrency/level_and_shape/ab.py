"""Automatic k with the step-cost corrections as level x shape (mtpx/core/cost_learning.py) against
one ratio per k (the code before, d482c92's StepCostLearning methods, loaded from git) and the
fixed contenders, side by side in one process: GSM8K test, greedy, at most 128 tokens, the
prompts cut into chunks, every contender generating each chunk in an order rotated per chunk.

    PYTHONPATH=. python experiments/concurrency/level_and_shape/ab.py CONCURRENCY CHUNKS PASSES [--compile] \
        [--contenders mtp8 auto auto-old] [--num-prompts 128]

Prints per chunk tok/s and, per pass, each contender's tok/s and the median of its paired ratio
to the first contender; auto's k and depth histograms and its final corrections."""
import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.core.draft_length import AutoDraftLength  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402


def old_policy_class():
    src = subprocess.run(["git", "-C", str(ROOT), "show", "d482c92:mtpx/core/cost_learning.py"],
                         capture_output=True, text=True, check=True).stdout
    old = types.ModuleType("old_cost_learning")
    exec(compile(src, "old_cost_learning.py", "exec"), old.__dict__)
    names = ("_known_ratios", "_learn_cost", "observe_parts", "_draft_per_module", "factor")
    return type("OneRatioPerK", (AutoDraftLength,), {n: old.StepCostLearning.__dict__[n] for n in names})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("concurrency", type=int)
    ap.add_argument("chunks", type=int)
    ap.add_argument("passes", type=int)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--contenders", nargs="+", default=["mtp8", "auto", "auto-old"])
    ap.add_argument("--num-prompts", type=int, default=128)
    args = ap.parse_args()
    data = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
    prompts = [format_prompt(r["question"]) for r in load_gsm8k(data)[: args.num_prompts]]
    chunks = [prompts[i:: args.chunks] for i in range(args.chunks)]
    params = SamplingParams(max_tokens=128, temperature=0.0)
    common = dict(threads=1, max_num_seqs=args.concurrency, max_model_len=1024, compile=args.compile)
    old_cls, llms = old_policy_class(), {}
    for name in args.contenders:
        if name == "plain":
            llms[name] = LLM("checkpoints/demo", **common)
        elif name.startswith("auto"):
            llms[name] = LLM("checkpoints/demo", spec="mtp8", num_speculative_tokens="auto", **common)
            if name == "auto-old":
                llms[name].engine.draft_length.__class__ = old_cls
        else:
            llms[name] = LLM("checkpoints/demo", spec="mtp8", num_speculative_tokens=int(name[3:]), **common)
    for name, llm in llms.items():
        print(name, getattr(llm, "calibration", {}).get("source") if name.startswith("auto") else "",
              flush=True)
    for p in range(args.passes):
        rates = {n: [] for n in llms}
        tokens = {n: 0 for n in llms}
        seconds = {n: 0.0 for n in llms}
        for name, llm in llms.items():
            if name.startswith("auto"):
                llm.engine.draft_length.reset_histograms()
        for c, chunk in enumerate(chunks):
            names = list(llms)
            names = names[c % len(names):] + names[: c % len(names)]
            for name in names:
                t = time.perf_counter()
                outs = llms[name].generate(chunk, params, max_concurrency=args.concurrency)
                dt = time.perf_counter() - t
                n = sum(len(o.output_token_ids) for o in outs)
                rates[name].append(n / dt)
                tokens[name] += n
                seconds[name] += dt
                print(f"pass {p} chunk {c}: {name} {n / dt:.1f} tok/s", flush=True)
        first = args.contenders[0]
        for name in llms:
            paired = statistics.median(r / b for r, b in zip(rates[name], rates[first]))
            line = (f"pass {p}: {name} {tokens[name] / seconds[name]:.1f} tok/s, paired median vs {first} "
                    f"{paired:.3f}x")
            if name.startswith("auto"):
                s = llms[name].engine.draft_length.summary()
                line += (f"; k {s['k_histogram']}; depths {s['depth_histogram']}; cost_factor "
                         f"{s['cost_factor']}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
