"""How long a compiled engine takes to build, cold and warm: each contender in a fresh process.

    python tools/bench_compile_time.py [--specs none mtp1 mtp8 auto] [--threads 2] \
        [--model checkpoints/demo] [--regions both|on|off] [--out experiments/compile_time]

For every contender (a spec, with engine.compile_regions on and/or off) two processes run one
after the other with the same, initially empty, cache folder ($MTPX_CACHE_DIR, which holds
Inductor's caches and automatic k's step costs): "cold" compiles everything, "warm" is a second
run of the same settings. Each process builds `LLM(model, spec, compile=True)` (compile and
warm-up; with `auto` also the step-cost calibration, cold only) and generates one request; it
reports the seconds from its start (before importing torch) to the engine being built and to
the first token. The greedy tokens of the cold and warm runs, and of an eager engine built in
the cold process, must be identical (exit status 1 otherwise). Writes compile_time.md and
.json into --out (atomically).
"""
from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."


def child(args) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from mtpx import LLM, SamplingParams
    torch.set_num_threads(args.threads)
    spec, k = ((None, None) if args.spec == "none" else ("mtp8", "auto") if args.spec == "auto"
               else (args.spec, None))
    t_import = time.perf_counter() - T0
    llm = LLM(args.model, spec=spec, num_speculative_tokens=k, compile=True,
              compile_regions=args.regions == "on", threads=args.threads)
    t_built = time.perf_counter() - T0
    params = SamplingParams(max_tokens=args.max_tokens)
    first = None
    for out in llm.generate([PROMPT], params):
        first = out.first_token_time
        tokens = out.output_token_ids
    stats = llm.compile_stats or {}
    row = {"import_s": round(t_import, 2), "built_s": round(t_built, 2),
           "first_token_s": None if first is None else round(first - T0, 2),
           "compile_s": stats.get("compile_s"), "num_graphs": stats.get("num_graphs"),
           "num_compiled": stats.get("num_compiled"), "num_loaded": stats.get("num_loaded"),
           "calibration_s": (llm.calibration or {}).get("seconds"), "tokens": tokens}
    if args.check_eager:
        eager = LLM(args.model, spec=spec, num_speculative_tokens=k, threads=args.threads,
                    cost_model_file=None)
        row["eager_identical"] = eager.generate([PROMPT], params)[0].output_token_ids == tokens
    print("RESULT " + json.dumps(row), flush=True)


def run_child(spec: str, regions: str, cache: str, threads: int, model: str, max_tokens: int,
              check_eager: bool) -> dict:
    env = {**os.environ, "MTPX_CACHE_DIR": cache, "OMP_NUM_THREADS": str(threads)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    cmd = [sys.executable, __file__, "--child", "--spec", spec, "--regions", regions, "--threads",
           str(threads), "--model", model, "--max-tokens", str(max_tokens)] \
        + (["--check-eager"] if check_eager else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"{spec} (regions {regions}) failed with exit status {proc.returncode}")
    log = [ln for ln in proc.stderr.splitlines()    # what each graph did (compiled, loaded, why not)
           if ln.startswith("engine.compile:") and " building " not in ln and " still building " not in ln]
    return {**json.loads(line[len("RESULT "):]), "process_s": round(wall, 2), "compile_log": log}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specs", nargs="+", default=["none", "mtp1", "mtp8", "auto"])
    ap.add_argument("--regions", default="on", choices=["on", "off", "both"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "demo"))
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--check-eager", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    rows, ok = [], True
    for spec in args.specs:
        for regions in (["on", "off"] if args.regions == "both" else [args.regions]):
            with tempfile.TemporaryDirectory(prefix="mtpx_compile_time_") as cache:
                cold = run_child(spec, regions, cache, args.threads, args.model, args.max_tokens, True)
                warm = run_child(spec, regions, cache, args.threads, args.model, args.max_tokens, False)
            same = cold["tokens"] == warm["tokens"] and cold.get("eager_identical", False)
            ok &= same
            rows.append({"spec": spec, "regions": regions, "cold": cold, "warm": warm, "identical": same})
            print(f"{spec:5s} regions {regions:3s}  cold: built {cold['built_s']:7.1f} s, first token "
                  f"{cold['first_token_s']} s, {cold['num_graphs']} graphs | warm: built "
                  f"{warm['built_s']:6.1f} s, first token {warm['first_token_s']} s, "
                  f"{warm['num_loaded']} loaded | identical {same}",
                  flush=True)
    if args.out:
        sys.path.insert(0, str(ROOT))
        from mtpx.io import atomic_write_json, atomic_write_text
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                "command": "python " + " ".join([Path(__file__).relative_to(ROOT).as_posix(),
                                                 *(argv or sys.argv[1:])])}
        atomic_write_json(out / "compile_time.json", {"meta": meta, "rows": rows})
        lines = [f"`{meta['command']}` ({meta['threads']} threads)", "",
                 "| contender | regions | cold: built (s) | cold: first token (s) | graphs | calibration (s) "
                 "| warm: built (s) | warm: first token (s) | loaded | tokens identical |",
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            c, w = r["cold"], r["warm"]
            lines.append(f"| {r['spec']} | {r['regions']} | {c['built_s']} | {c['first_token_s']} "
                         f"| {c['num_graphs']} "
                         f"| {c['calibration_s'] if c['calibration_s'] is not None else '-'} "
                         f"| {w['built_s']} | {w['first_token_s']} | {w['num_loaded']} of {w['num_graphs']} "
                         f"| {r['identical']} |")
        atomic_write_text(out / "compile_time.md", "\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
