"""The demo's eager mtp8 engine at concurrency 1 (max_num_seqs 1, 1 thread) calibrated three times
in one process (calibrate_step_costs with its defaults): seconds and the batch-1 ms per k.
usage: OMP_NUM_THREADS=1 python experiments/concurrency/settled/calibrate.py"""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from host_setup import engine  # noqa: E402

from mtpx.auto_k import calibration  # noqa: E402


def calibrate_step_costs(eng, **kw):
    """mtpx.auto_k.calibration.calibrate_step_costs over the engine's Engine.time_decode_steps (the
    start-up calibration's measure; an eager engine, each k its own step). Returns {(k, B): ms}."""
    def measure(b, ks, context_len, rounds, seed=0, draft=None):
        return eng.time_decode_steps(b, ks, context_len, rounds, seed=seed, draft=draft)
    return calibration.calibrate_step_costs(measure, eng.num_speculative_tokens, eng.config.max_num_seqs,
                                            **kw)


e = engine("auto", compile=False).engine
for i in range(3):
    t = time.perf_counter()
    c = calibrate_step_costs(e)
    print(i, round(time.perf_counter() - t, 1), "s", [round(c[(k, 1)], 2) for k in range(9)], flush=True)
