"""bf16 against fp32 on this CPU, on the demo checkpoint: plain-decoding output tok/s at batch 1 and
64 (`mtpx.LLM(dtype=...)`, random prompts, fixed output lengths) and mode=train's step
(`train.autocast=bfloat16` against float32: the joint objective, 16 x 256 tokens, AdamW).
The contenders alternate, `--repeats` times each, after one untimed warm-up each.

    python experiments/bf16_cpu/bench.py [--threads 2] [--repeats 2] > experiments/bf16_cpu/bench.md
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.train import checkpoint as ckpt  # noqa: E402
from mtpx.train.loop import build_optimizer, train_step  # noqa: E402
from mtpx.train.losses import Objective  # noqa: E402

DEMO = ROOT / "checkpoints" / "demo"


def decode_rate(llm: LLM, prompts, max_tokens: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    dt = time.perf_counter() - t0
    return sum(len(o.output_token_ids) for o in outs) / dt, [o.output_token_ids for o in outs]


def train_rate(dtype, batch, repeats: int) -> list[float]:
    model, _ = ckpt.load_model(DEMO)
    model.train()
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, freeze_base=False)
    obj = Objective(model, mtp_loss_weight=0.3)
    rates = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        train_step(model, opt, batch, lr=1e-3, grad_clip=1.0, mtp_loss_weight=0.3, objective=obj,
                   autocast=dtype)
        if i:                                            # step 0 allocates
            rates.append(batch.numel() / (time.perf_counter() - t0))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, demo checkpoint, {args.repeats} timed "
          "repeats\n")
    print("| what | fp32 | bf16 | bf16 / fp32 | greedy tokens identical |")
    print("|---|---:|---:|---:|---|")
    llms = {d: LLM(model=DEMO, dtype=d, max_num_seqs=64) for d in ("float32", "bfloat16")}
    vocab = llms["float32"].model.cfg.vocab_size
    for batch, prompt_len, max_tokens in ((1, 128, 64), (64, 128, 32)):
        prompts = [torch.randint(2, vocab, (prompt_len,), generator=g).tolist() for _ in range(batch)]
        for llm in llms.values():
            decode_rate(llm, prompts[:1], 4)             # warm-up
        rates = {d: [] for d in llms}
        tokens = {}
        for _ in range(args.repeats):
            for d, llm in llms.items():
                r, tokens[d] = decode_rate(llm, prompts, max_tokens)
                rates[d].append(r)
        same = sum(a == b for a, b in zip(tokens["float32"], tokens["bfloat16"]))
        f, b = statistics.median(rates["float32"]), statistics.median(rates["bfloat16"])
        print(f"| decode tok/s, batch {batch} ({prompt_len}-token prompts, {max_tokens} new) | {f:.1f} "
              f"({min(rates['float32']):.1f}-{max(rates['float32']):.1f}) | {b:.1f} "
              f"({min(rates['bfloat16']):.1f}-{max(rates['bfloat16']):.1f}) | {b / f:.2f}x | "
              f"{same}/{batch} |",
              flush=True)
    del llms
    batch = torch.randint(2, vocab, (16, 256), generator=g)
    tr = {"float32": [], "bfloat16": []}
    for _ in range(args.repeats):   # each call: a fresh model, one untimed step, then one timed one
        tr["float32"] += train_rate(None, batch, 1)
        tr["bfloat16"] += train_rate(torch.bfloat16, batch, 1)
    f, b = statistics.median(tr["float32"]), statistics.median(tr["bfloat16"])
    print(f"| training tokens/s (16 x 256, joint objective, AdamW) | {f:.0f} ({min(tr['float32']):.0f}-"
          f"{max(tr['float32']):.0f}) | {b:.0f} ({min(tr['bfloat16']):.0f}-{max(tr['bfloat16']):.0f}) | "
          f"{b / f:.2f}x | - |")


if __name__ == "__main__":
    main()
