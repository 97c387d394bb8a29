"""The demo's eager mtp8 engine at concurrency 1 (max_num_seqs 1, 1 thread) calibrated three times
in one process (calibrate_step_costs with its defaults): seconds and the batch-1 ms per k.
usage: OMP_NUM_THREADS=1 python experiments/concurrency/settled/calibrate.py"""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from host_setup import engine  # noqa: E402

from mtpx.engine.auto_k.costs import calibrate_step_costs  # noqa: E402

e = engine("auto", compile=False).engine
for i in range(3):
    t = time.perf_counter()
    c = calibrate_step_costs(e)
    print(i, round(time.perf_counter() - t, 1), "s", [round(c[(k, 1)], 2) for k in range(9)], flush=True)
