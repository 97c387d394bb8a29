"""Where auto's start-up calibration spends its time at one batch size: engine steps with prompt
tokens (the fresh requests' prefill) against pure decode steps, eager, demo.

    OMP_NUM_THREADS=2 python experiments/auto_k/main_job/calibration_time.py BATCH
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
from mtpx.auto_k.store import save_step_costs  # noqa: E402


def calibrate_step_costs(eng, **kw):
    """mtpx.auto_k.calibration.calibrate_step_costs over the engine's Engine.time_decode_steps (the
    start-up calibration's measure; an eager engine, each k its own step). Returns {(k, B): ms}."""
    def measure(b, ks, context_len, rounds, seed=0, draft=None):
        return eng.time_decode_steps(b, ks, context_len, rounds, seed=seed, draft=draft)
    return calibration.calibrate_step_costs(measure, eng.num_speculative_tokens, eng.config.max_num_seqs,
                                            **kw)


torch.set_num_threads(2)
B = int(sys.argv[1])
fake = Path(tempfile.mkdtemp()) / "costs.json"          # skips the LLM's own start-up calibration
save_step_costs(fake, {(k, B): 10.0 + k for k in range(9)}, {})
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
          max_num_seqs=B, cost_model_file=fake)
engine = llm.engine
step = engine.step
spent = {"steps with prompt tokens": 0.0, "decode steps": 0.0}


def timed_step():
    t = time.perf_counter()
    out = step()
    last = engine.step_timings[-1] if engine.step_timings else None
    spent["steps with prompt tokens" if last is not None and last.num_prefill_tokens else "decode steps"] += (
        time.perf_counter() - t)
    return out


engine.step = timed_step
t = time.perf_counter()
calibrate_step_costs(engine, batch_sizes=[B])         # the first batch size: with the untimed sweep
print(f"batch {B}: calibration {time.perf_counter() - t:.1f} s; "
      + ", ".join(f"{k} {v:.1f} s" for k, v in spent.items()))
