"""The compiled decode step with ragged verification windows (engine.ragged_batch, the default)
against the padded grid (ragged_batch=false), side by side on one engine: mtp8 (k = 8), the
demo checkpoint, B requests at 192 known tokens, each verifying its own number of drafts (the
mix), every request of depth 8. The two settings alternate call by call, in an order reversed
every round; each cell is the median of the paired ratios (ragged / grid) over the rounds, with
the quartiles, and the median ms of each.

    OMP_NUM_THREADS=1 python experiments/ragged_compiled/step_ms.py [--rounds 15] [--out DIR]

Mixes: full (every request 8 drafts: the packing's cost alone), half (8 and 0 alternately),
spread (request i verifies i % 9). Batch 17 is padded to the capture size 24 (the grid pays the
7 padding rows; the ragged step does not)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import mtpx.engine.model_runner as model_runner  # noqa: E402
from mtpx import LLM  # noqa: E402

MIXES = {"full": lambda i: 8, "half": lambda i: 8 * (i % 2 == 0), "spread": lambda i: i % 9}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 17, 64])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "ragged_compiled"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=8,
              max_num_seqs=max(args.batch_sizes), compile=True)
    engine, runner = llm.engine, llm.engine.runner
    print(f"engine built in {time.perf_counter() - t0:.1f} s", flush=True)
    mix = {}
    real = model_runner.ScheduledDecode

    def scheduled(request, num_draft_tokens, block_table):   # each request's own count (the mix)
        return real(request, mix[request.index], block_table)

    model_runner.ScheduledDecode = scheduled
    base = runner.config
    rows = []
    for B in args.batch_sizes:
        for name, f in MIXES.items():
            if B == 1 and name != "full":
                continue
            mix.clear()
            mix.update({-1 - i: f(i) for i in range(B)})
            ms = {True: [], False: []}
            for r in range(args.rounds + 2):
                for ragged in ((True, False) if r % 2 == 0 else (False, True)):
                    runner.config = dataclasses.replace(base, ragged_batch=ragged)
                    (t,) = engine.time_decode_steps(B, [8], 192, rounds=1, warmup=0)[8]
                    if r >= 2:
                        ms[ragged].append(t)
            ratios = sorted(a / b for a, b in zip(ms[True], ms[False]))
            q = statistics.quantiles(ratios, n=4)
            tokens = sum(1 + mix[-1 - i] for i in range(B))
            row = {"batch": B, "mix": name, "real_tokens": tokens,
                   "grid_tokens": engine.compiled.padded_batch(B) * 9,
                   "ragged_ms": round(statistics.median(ms[True]), 3),
                   "grid_ms": round(statistics.median(ms[False]), 3),
                   "ragged_over_grid": round(statistics.median(ratios), 3),
                   "quartiles": [round(x, 3) for x in (q[0], q[2])]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    lines = ["| batch | mix | real / grid tokens | ragged ms | grid ms | ragged / grid (paired median, "
             "quartiles) |",
             "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['mix']} | {r['real_tokens']} / {r['grid_tokens']} | {r['ragged_ms']} | "
              f"{r['grid_ms']} | {r['ragged_over_grid']:.3f}x "
              f"({r['quartiles'][0]:.3f}-{r['quartiles'][1]:.3f}) |"
              for r in rows]
    (out / "step_ms.md").write_text("\n".join(lines) + "\n")
    (out / "step_ms.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
