"""Start-up calibrations at batch 1 (eager, the demo, 1 thread) with one pass against three
(calibrate_step_costs' least of passes), alternated, while a neighbour process loads the machine
in random bursts; each scored by its shape error against a quiet reference.

    python experiments/step_costs/calibration_passes/passes.py [repeats]

Reference: each k timed alone (Engine.time_decode_steps with one k, 16 rounds, the least of three
medians), with no neighbour. Shape error of a calibration c: smoothed (smooth_step_costs) and
divided by the reference, the largest |ratio_k / median ratio - 1| over k: the level does not
matter (automatic k's online factor corrects it), the shape does (a k it does not run keeps the
calibration's cost relative to those it runs)."""
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time

import torch


def neighbour(stop):                       # bursts of 0.5-4 s of 2-thread matmuls, pauses of 0.5-3 s
    torch.set_num_threads(2)
    a = torch.randn(512, 512)
    rng = random.Random(1)
    while not stop.is_set():
        end = time.time() + rng.uniform(0.5, 4.0)
        while time.time() < end:
            a @ a
        stop.wait(rng.uniform(0.5, 3.0))


def main(repeats: int) -> None:
    from mtpx.auto_k.calibration import calibrate_step_costs
    from mtpx.auto_k.cost_curve import smooth_step_costs
    from mtpx.auto_k.store import save_step_costs
    from mtpx.engine.llm import LLM
    path = os.path.join(tempfile.mkdtemp(), "costs.json")
    save_step_costs(path, {(k, 1): 10.0 + k for k in range(9)}, {})      # no start-up calibration
    llm = LLM("checkpoints/demo", spec="mtp8", num_speculative_tokens="auto", threads=1, max_num_seqs=1,
              cost_model_file=path)
    e = llm.engine

    def measure(b, ks, context_len, rounds, seed=0, draft=None):     # the start-up calibration's
        return e.time_decode_steps(b, ks, context_len, rounds, seed=seed, draft=draft)

    ref = [min(statistics.median(e.time_decode_steps(1, [k], 192, 16)[k]) for _ in range(3))
           for k in range(9)]
    print("reference (ms, k = 0..8):", [round(x, 1) for x in ref], flush=True)

    def shape_error(c):
        s = smooth_step_costs([c[(k, 1)] for k in range(9)])
        r = [x / y for x, y in zip(s, ref)]
        m = statistics.median(r)
        return max(abs(x / m - 1) for x in r), [round(x, 1) for x in s]

    stop = mp.Event()
    p = mp.Process(target=neighbour, args=(stop,), daemon=True)
    p.start()
    errors = {1: [], 3: []}
    try:
        for i in range(repeats):
            for passes in ((1, 3) if i % 2 == 0 else (3, 1)):
                t = time.perf_counter()
                costs = calibrate_step_costs(measure, 8, 1, batch_sizes=[1], passes=passes)
                err, curve = shape_error(costs)
                errors[passes].append(err)
                print(f"repeat {i} passes {passes}: {time.perf_counter() - t:.1f} s, shape error "
                      f"{100 * err:.1f}%, smoothed {curve}", flush=True)
    finally:
        stop.set()
        p.join()
    for passes, errs in errors.items():
        errs = sorted(errs)
        print(f"passes {passes}: shape error median {100 * statistics.median(errs):.1f}%, max "
              f"{100 * errs[-1]:.1f}%, over 10%: {sum(x > 0.1 for x in errs)} of {len(errs)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
