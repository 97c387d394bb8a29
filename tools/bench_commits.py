"""Decode tokens/s of two source trees (e.g. the previous commit in a git worktree and this one),
side by side in one run: the same checkpoint, speculators, batch sizes, eager and compiled.

    git worktree add /tmp/prev HEAD~1
    python tools/bench_commits.py --trees /tmp/prev . --names before after \
        [--specs none mtp8] [--compile off on] [--batch-sizes 1 16] [--input-len 64] \
        [--output-len 128] [--repeats 3] [--out outputs/bench_commits]

For each (spec, compile) one worker process per tree imports mtpx from that tree and builds its
LLM (compiled ones warm up first, one after the other, so they never compete for the cores).
Then, per batch size, each worker runs one untimed round and the workers alternate for `repeats`
timed rounds: `batch` random prompts of input-len tokens generate exactly output-len tokens
(greedy, ignore_eos), all at once. Decode tokens/s = output tokens after each request's first /
(time from the last first token to the last finish). The greedy tokens of the trees must be
identical (exit status 1 otherwise). Writes bench_commits.md and .json into --out atomically.
Spec `auto`: automatic k over mtp8's modules; the first tree calibrates its step costs into
--out/step_costs_compile_{off,on}.json and the second loads that file (LLM's cost_model_file), so
both decide on the same costs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtpx.io import atomic_write_json, atomic_write_text  # noqa: E402

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(int(sys.argv[2]))
from mtpx import LLM, SamplingParams
cfg = json.loads(sys.argv[3])
auto = cfg["spec"] == "auto"        # automatic k over mtp8's modules, its step costs from one shared file
llm = LLM(model=cfg["model"], spec="mtp8" if auto else cfg["spec"], max_num_seqs=cfg["max_num_seqs"],
          max_model_len=cfg["max_model_len"], compile=cfg["compile"],
          **(dict(num_speculative_tokens="auto", cost_model_file=cfg["cost_model_file"]) if auto else {}))
print(json.dumps({"ready": True, "compile": llm.compile_stats}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    params = SamplingParams(max_tokens=job["output_len"], ignore_eos=True)
    outs = llm.generate(job["prompts"], params)
    first = max(o.first_token_time for o in outs)
    last = max(o.finish_time for o in outs)
    n = sum(len(o.output_token_ids) - 1 for o in outs)
    print(json.dumps({"decode_tok_s": n / max(last - first, 1e-9),
                      "tokens": [o.output_token_ids for o in outs]}), flush=True)
"""


class Worker:
    def __init__(self, tree: str, threads: int, cfg: dict):
        self.p = subprocess.Popen([sys.executable, "-c", WORKER, str(Path(tree).resolve()), str(threads),
                                   json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": str(Path(tree).resolve())})
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited ({self.p.wait()})")
        return json.loads(line)

    def run(self, prompts, output_len: int) -> dict:
        self.p.stdin.write(json.dumps({"prompts": prompts, "output_len": output_len}) + "\n")
        self.p.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs=2, required=True)
    ap.add_argument("--names", nargs=2, default=["before", "after"])
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--specs", nargs="+", default=["none", "mtp8"])
    ap.add_argument("--compile", nargs="+", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="outputs/bench_commits")
    args = ap.parse_args(argv)
    import torch
    g = torch.Generator().manual_seed(args.seed)
    rows, ok = [], True
    for spec in args.specs:
        for comp in args.compile:
            cfg = {"model": args.model, "spec": None if spec == "none" else spec,
                   "max_num_seqs": max(args.batch_sizes), "compile": comp == "on",
                   "max_model_len": args.input_len + args.output_len + 16,
                   "cost_model_file": str(Path(args.out).resolve() / f"step_costs_compile_{comp}.json")}
            Path(args.out).mkdir(parents=True, exist_ok=True)
            workers = [Worker(t, args.threads, cfg) for t in args.trees]
            for B in args.batch_sizes:
                prompts = torch.randint(1, 2048, (B, args.input_len), generator=g).tolist()
                for w in workers:
                    w.run(prompts, args.output_len)                          # untimed
                runs = [[], []]
                for rep in range(args.repeats):
                    order = (0, 1) if rep % 2 == 0 else (1, 0)
                    for i in order:
                        runs[i].append(workers[i].run(prompts, args.output_len))
                same = all(a["tokens"] == b["tokens"] for a, b in zip(*runs))
                ok &= same
                med = [statistics.median(r["decode_tok_s"] for r in rs) for rs in runs]
                row = {"spec": spec, "compile": comp, "batch_size": B,
                       args.names[0]: med[0], args.names[1]: med[1], "ratio": med[1] / med[0],
                       "runs": {n: [round(r["decode_tok_s"], 1) for r in rs]
                                for n, rs in zip(args.names, runs)},
                       "tokens_identical": same,
                       "compile_s": {n: (w.ready["compile"] or {}).get("compile_s")
                                     for n, w in zip(args.names, workers)}}
                rows.append(row)
                print(f"{spec} compile={comp} batch {B}: {args.names[0]} {med[0]:.1f}, {args.names[1]} "
                      f"{med[1]:.1f} tok/s ({row['ratio']:.2f}x); tokens identical: {same}", flush=True)
            for w in workers:
                w.close()
    result = {"trees": args.trees, "names": args.names, "model": args.model, "threads": args.threads,
              "platform": platform.platform(), "input_len": args.input_len, "output_len": args.output_len,
              "repeats": args.repeats, "rows": rows}
    a, b = args.names
    lines = [f"# Decode tok/s, {a} vs {b} (median of {args.repeats} alternating rounds; "
             f"{args.input_len}-token prompts, {args.output_len} output tokens, {args.threads} threads)", "",
             f"| spec | compile | batch | {a} | {b} | {b} / {a} | runs {a} | runs {b} | tokens identical |",
             "|---|---|---:|---:|---:|---:|---|---|:---:|"]
    for r in rows:
        lines.append(f"| {r['spec']} | {r['compile']} | {r['batch_size']} | {r[a]:.1f} | {r[b]:.1f} | "
                     f"{r['ratio']:.2f}x | {r['runs'][a]} | {r['runs'][b]} | "
                     f"{'yes' if r['tokens_identical'] else 'NO'} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "bench_commits.json", result)
    atomic_write_text(out / "bench_commits.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
