"""The cost model against the measurement: for every fixed contender of a bench_speedup.py run,
the speed-up over plain decoding predicted from step costs and the contender's own measured
acceptance length, beside the measured speed-up of the same run.

    python experiments/auto_k/predict.py experiments/auto_k/conc1/speedup.json ...

predicted(k) = acceptance_length_k * t(0, B) / t(k, B), B = the run's concurrency, from two
sources of step costs, both from the same process as the measurement:
- calibration: the automatic k's start-up calibration (a decode step of B requests of depth k:
  the step of an engine with k modules; k = 0 is plain decoding's step);
- in the run: each contender's own median pure decode step at batch B during the measured chunks
  (bench_speedup.py's engine_time; plain's for t(0, B)).
measured: the median over chunks of the paired throughput ratio; decode only: output tokens per
second of decode-step time, which leaves out prefill and the scheduler. The model ignores prefill
and the batch's tail (requests finishing while others decode), which the measurement includes.
"""
import json
import sys


def _run_cost(row, k, b):
    step = row.get("engine_time", {}).get("step_ms", {}).get(str(k), {})
    return step.get(str(b))


def main(paths):
    for path in paths:
        data = json.load(open(path))
        conc = data["args"]["concurrency"]
        rows = {r["contender"]: r for r in data["rows"]}
        auto = next(r for r in rows.values() if "auto_k" in r)
        costs = {(c["k"], c["batch_size"]): c["step_ms"] for c in auto["auto_k"]["step_costs_ms"]}
        b = max(bs for _, bs in costs if bs <= conc)
        plain = rows["plain"]
        plain_run = _run_cost(plain, 0, conc)
        plain_dec = plain["output_tokens"] / plain["engine_time"]["decode_s"]
        seen = "none at full batch" if plain_run is None else f"{plain_run:.1f} ms"
        print(f"## concurrency {conc} (calibrated at batch {b}: plain step {costs[(0, b)]:.1f} ms; "
              f"plain's median decode step in the run {seen})")
        print("| contender | k | acceptance length | measured vs plain | decode only | "
              "predicted (calibration) | / measured | predicted (step costs in the run) | / measured |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, r in rows.items():
            if "auto_k" in r or name in ("plain", "mtp1"):
                continue
            k = int(name.split(":")[1]) if ":" in name else int(name[3:])
            al, m = r["acceptance_length"], r["ratio_median"]
            cal = al * costs[(0, b)] / costs[(k, b)]
            run = _run_cost(r, k, conc)
            inrun = (f"{al * plain_run / run:.2f}x | {al * plain_run / run / m:.2f}" if run and plain_run
                     else "— | —")
            dec = (r["output_tokens"] / r["engine_time"]["decode_s"]) / plain_dec
            print(f"| {name} | {k} | {al:.2f} | {m:.2f}x | {dec:.2f}x | {cal:.2f}x | {cal / m:.2f} | "
                  f"{inrun} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
