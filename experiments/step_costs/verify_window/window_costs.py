"""Where the 9-token verification forward's extra time over the 1-token forward goes, at batch 1 on
this CPU, part by part, each part timed alternately at both widths in one process:

- matmuls: every nn.Linear of the target (and the tied lm_head) as the ATen mm a compiled graph
  calls (aoti_torch_cpu_mm_out), over 1 row and over 9 rows, on the checkpoint's own weights;
- Gated DeltaNet mixing: the window form over 9 tokens (mtpx.models.gated_delta_rule.
  window_gated_delta_rule) against the recurrent form over 1 token, compiled with the engine's
  Inductor options (cpp_wrapper), once per Gated DeltaNet layer of the checkpoint.

    python experiments/step_costs/verify_window/window_costs.py [--model checkpoints/demo] [--repeats 300]

Prints a markdown table (ms per forward, 1 token and 9 tokens, and the difference).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx.hf.loader import load_pretrained  # noqa: E402
from mtpx.models.gated_delta_rule import recurrent_gated_delta_rule, window_gated_delta_rule  # noqa: E402


def _alternate(fns: dict, repeats: int) -> dict:
    """{name: median ms}, the calls alternated name by name, after two untimed rounds."""
    for _ in range(2):
        for f in fns.values():
            f()
    times = {n: [] for n in fns}
    for _ in range(repeats):
        for n, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[n].append(time.perf_counter() - t0)
    return {n: 1e3 * statistics.median(v) for n, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--window", type=int, default=9)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = load_pretrained(args.model)[0].eval()
    # the target's linears (model.*) and the lm_head, not the draft modules' (mtp.*)
    weights = [m.weight for m in model.model.modules() if isinstance(m, torch.nn.Linear)]
    weights.append(model.lm_head.weight)
    T = args.window
    rows = {}
    with torch.inference_mode():
        outs = {(w.data_ptr(), m): torch.empty(m, w.shape[0]) for w in weights for m in (1, T)}
        xs = {(w.shape[1], m): torch.randn(m, w.shape[1]) for w in weights for m in (1, T)}

        def mms(m):
            def run():
                for w in weights:
                    torch.mm(xs[(w.shape[1], m)], w.t(), out=outs[(w.data_ptr(), m)])
            return run

        rows[f"matmuls ({len(weights)} linears, ATen mm)"] = _alternate({"1": mms(1), "T": mms(T)},
                                                                        args.repeats)

        cfg = model.cfg
        n_gdn = sum(t == "linear_attention" for t in cfg.layer_types)
        H, Dk, Dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim

        def inputs(t):
            return (torch.randn(1, t, H, Dk), torch.randn(1, t, H, Dk), torch.randn(1, t, H, Dv),
                    -torch.rand(1, t, H), torch.rand(1, t, H), torch.randn(1, H, Dk, Dv))

        x1, xT = inputs(1), inputs(T)

        def per_layer(fn):
            return lambda *x: [fn(*x) for _ in range(n_gdn)]

        opts = {"cpp_wrapper": True}
        rec = torch.compile(per_layer(lambda *x: recurrent_gated_delta_rule(*x)[:2]), options=opts)
        win = torch.compile(per_layer(lambda *x: window_gated_delta_rule(*x)), options=opts)
        rows[f"Gated DeltaNet mixing ({n_gdn} layers, compiled)"] = _alternate(
            {"1": lambda: rec(*x1), "T": lambda: win(*xT)}, args.repeats)

    print(f"| part (batch 1, {args.threads} threads) | 1 token ms | {T} tokens ms | difference ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['1']:.3f} | {r['T']:.3f} | {r['T'] - r['1']:.3f} | {r['T'] / r['1']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
