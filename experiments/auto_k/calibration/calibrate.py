"""The start-up calibration of num_speculative_tokens=auto as LLM runs it on a machine's first run
(Engine.time_decode_steps: no prefill, the ks alternated call by call), timed, with its costs,
eager, demo, max_num_seqs 64; run REPEATS times in one process to show its spread.

    OMP_NUM_THREADS=2 python experiments/auto_k/calibration/calibrate.py [REPEATS]
"""
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM  # noqa: E402
from mtpx.auto_k import calibration  # noqa: E402
from mtpx.auto_k.calibration import default_batch_sizes  # noqa: E402
from mtpx.auto_k.store import save_step_costs  # noqa: E402


def calibrate_step_costs(eng, **kw):
    """mtpx.auto_k.calibration.calibrate_step_costs over the engine's Engine.time_decode_steps (the
    start-up calibration's measure; an eager engine, each k its own step). Returns {(k, B): ms}."""
    def measure(b, ks, context_len, rounds, seed=0, draft=None):
        return eng.time_decode_steps(b, ks, context_len, rounds, seed=seed, draft=draft)
    return calibration.calibrate_step_costs(measure, eng.num_speculative_tokens, eng.config.max_num_seqs,
                                            **kw)


torch.set_num_threads(2)
repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
fake = Path(tempfile.mkdtemp()) / "costs.json"          # skips the LLM's own start-up calibration
save_step_costs(fake, {(k, 1): 10.0 + k for k in range(9)}, {})
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
          max_num_seqs=64, cost_model_file=fake)
for i in range(repeats):
    t = time.perf_counter()
    costs = calibrate_step_costs(llm.engine)
    print(f"calibration {i}: {time.perf_counter() - t:.1f} s", flush=True)
    for b in default_batch_sizes(64):
        ms = [costs[(k, b)] for k in range(9)]
        print(f"  batch {b:2d}: step ms k=0..8 {[round(x, 1) for x in ms]}; / k=0: "
              f"{[round(x / ms[0], 2) for x in ms]}", flush=True)
