"""Cost model: measure step costs per num_speculative_tokens (k) and batch size, predict output
throughput for every k from a run's per-position acceptance, recommend k, and compare with runs.

    python tools/cost_model.py --acceptance RUN_DIR [--model checkpoints/demo] [--spec mtp8] \
        [--ks 0 1 2 4 8] [--batch-sizes 1 16 64] [--measured RUN_DIR ...] [--out DIR]

RUN_DIR is a run folder of `train_or_eval.py` (its metrics.json gives per_position_acceptance; use
a run with the largest k). Each --measured run's output throughput is compared with the prediction
at its k and mean decode batch (added to the batch sizes). The model and its assumptions:
mtpx/auto_k/costs.py. The step costs are automatic k's start-up calibration
(calibrate_step_costs: every k from 0 to the largest of --ks at each batch size). Writes
cost_model.md and cost_model.json into --out (atomically).
Exit status: 0, or 1 with a one-line error.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from omegaconf import OmegaConf  # noqa: E402

from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402
from mtpx.auto_k.costs import predict, recommend  # noqa: E402
from mtpx.engine.engine import measure_step_costs  # noqa: E402
from mtpx.hf.loader import load_pretrained  # noqa: E402


def _run(run_dir: Path) -> dict:
    """metrics.json of a run plus its k and concurrency (from .hydra/config.yaml)."""
    file = run_dir / "metrics.json"
    if not file.is_file():
        raise FileNotFoundError(f"{run_dir} has no metrics.json: pass a run folder of train_or_eval.py")
    m = json.loads(file.read_text())
    cfg_file = run_dir / ".hydra" / "config.yaml"
    conc = None
    if cfg_file.is_file():
        cfg = OmegaConf.load(cfg_file)
        client = cfg.get("bench") if cfg.get("mode") == "bench" else cfg.get("eval")
        conc = client.get("concurrency") if client is not None else None
    batch = round(m["mean_decode_batch"]) if m.get("mean_decode_batch") else conc
    return {"dir": str(run_dir), "k": len(m.get("per_position_acceptance") or []),
            "concurrency": conc, "batch": batch, "metrics": m}


def _md(rows: list[list], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--acceptance", required=True, type=Path,
                    help="run folder whose per-position acceptance is used")
    ap.add_argument("--model", default="checkpoints/demo")
    ap.add_argument("--spec", default="mtp8", choices=["mtp1", "mtp8"])
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4, 8],
                    help="ks to report (all are measured)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--measured", type=Path, nargs="*", default=[])
    ap.add_argument("--rounds", type=int, default=8,
                    help="timed decode steps per (k, batch size); the median is kept")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    try:
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        acc = _run(args.acceptance)["metrics"]["per_position_acceptance"]
        if not acc or any(a is None for a in acc):
            raise ValueError(f"{args.acceptance}: no per-position acceptance (a run without speculation?)")
        measured = [_run(d) for d in args.measured]
        sizes = sorted(set(args.batch_sizes) | {r["batch"] for r in measured if r["batch"]})
        ks = sorted(set(args.ks) | {r["k"] for r in measured})
        model, _ = load_pretrained(args.model)
        costs = [c for c in measure_step_costs(model, args.spec, sizes, max(ks), rounds=args.rounds)
                 if c["k"] in ks]
        preds = predict(acc, costs)
        best = recommend(preds)
    except (OSError, ValueError) as err:
        print(f"cost_model.py: error: {err}", file=sys.stderr)
        return 1
    table = _md([[p["k"], p["batch_size"], f"{p['step_ms']:.1f}",
                  f"{p['tokens_per_round']:.2f}", f"{p['predicted_throughput']:.0f}"] for p in preds],
                ["k", "batch", "ms/step", "tokens/round", "predicted tok/s"])
    rec = "\n".join(f"- batch {b}: k = {k}" for b, k in best.items())
    by_key = {(p["k"], p["batch_size"]): p for p in preds}
    cmp_rows = []
    for r in measured:
        p = by_key.get((r["k"], r["batch"]))
        got = r["metrics"]["output_throughput"]
        pred = None if p is None else p["predicted_throughput"]
        cmp_rows.append([r["dir"], r["k"], r["concurrency"], r["batch"], f"{got:.0f}",
                         "—" if pred is None else f"{pred:.0f}",
                         "—" if pred is None else f"{got / pred:.2f}"])
    text = (f"# Cost model ({args.spec}, acceptance from {args.acceptance})\n\n{table}\n\n"
            f"Recommended k (highest predicted output throughput):\n{rec}\n")
    if cmp_rows:
        text += ("\nPredicted vs measured: the prediction at the run's mean decode batch (metrics.json "
                 "mean_decode_batch); the measurement includes prefill and the ramp-down at the end:\n\n")
        text += _md(cmp_rows, ["run", "k", "concurrency", "mean decode batch", "measured tok/s",
                               "predicted tok/s", "measured / predicted"]) + "\n"
    print(text)
    atomic_write_text(args.out / "cost_model.md", text)
    atomic_write_json(args.out / "cost_model.json", {
        "acceptance": acc, "predictions": preds, "recommended_k": {str(b): k for b, k in best.items()},
        "measured": [{k: v for k, v in r.items() if k != "metrics"}
                     | {"output_throughput": r["metrics"]["output_throughput"]}
                     for r in measured]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
