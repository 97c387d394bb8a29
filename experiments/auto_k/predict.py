"""The cost model against the measurement: for every fixed contender of a bench_speedup.py run,
the speed-up over plain decoding predicted from measured step costs and the contender's own
measured acceptance length, beside the measured speed-up of the same run.

    python experiments/auto_k/predict.py experiments/auto_k/plain_costs.json experiments/auto_k/conc1/speedup.json ...

predicted(k) = (acceptance_length_k / t(k, B)) / (1 / t_plain(B)), with t(k, B) the automatic k's
start-up calibration in that run (a decode step of B requests of depth k, B = the run's
concurrency: the step of an engine with k modules) and t_plain(B) plain decoding's step
(plain_costs.json: mtpx.engine.calibration on an engine without a speculator). It ignores prefill
and the batch's tail (requests finishing while others decode), which the measurement includes.
"""
import json
import sys


def main(plain_path, paths):
    plain = {r["batch_size"]: r["step_ms"] for r in json.load(open(plain_path))}
    for path in paths:
        data = json.load(open(path))
        conc = data["args"]["concurrency"]
        rows = data["rows"]
        auto = next(r for r in rows if "auto_k" in r)
        costs = {(c["k"], c["batch_size"]): c["step_ms"] for c in auto["auto_k"]["step_costs_ms"]}
        b = max(bs for _, bs in costs if bs <= conc)
        print(f"## concurrency {conc} (step costs at batch {b}; plain {plain[b]:.1f} ms, "
              f"auto's calibrated step at depth 0 {costs[(0, b)]:.1f} ms)")
        factor = auto["auto_k"].get("cost_factor")
        print("| contender | k | measured vs plain | predicted (calibration) | / measured | "
              "predicted (x the run's learned cost factor) | / measured |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            name = r["contender"]
            if "auto_k" in r or name == "plain" or name == "mtp1":
                continue
            k = int(name.split(":")[1]) if ":" in name else int(name[3:])
            pred = (r["acceptance_length"] / costs[(k, b)]) / (1 / plain[b])
            m = r["ratio_to_plain"]
            fixed = f"{pred / factor:.2f}x | {pred / factor / m:.2f}" if factor else "— | —"
            print(f"| {name} | {k} | {m:.2f}x | {pred:.2f}x | {pred / m:.2f} | {fixed} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
