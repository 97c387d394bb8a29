"""Three start-up calibrations at one batch size in one process, each followed by fixed k = 0, 4
and 8 engines on random prompts, eager, demo: every calibration sample per k (a median of them
is the calibrated cost), and k8 / k4 from the calibration against the fixed engines'.

    OMP_NUM_THREADS=2 python experiments/auto_k/main_job/calibration_noise.py BATCH
"""
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import mtpx.engine.draft_length as draft_length  # noqa: E402
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.engine.auto_k.costs import step_costs  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1])
M = str(ROOT / "checkpoints" / "demo")
fake = Path(tempfile.mkdtemp()) / "costs.json"          # skips the LLM's own start-up calibration
draft_length.save_step_costs(fake, {(k, B): 10.0 + k for k in range(9)}, {})
auto = LLM(model=M, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=B, max_model_len=1024,
           cost_model_file=fake)
fixed = {k: LLM(model=M, spec=None if k == 0 else "mtp8", num_speculative_tokens=k or None, max_num_seqs=B,
                max_model_len=1024) for k in (0, 4, 8)}
samples = []
median = statistics.median


def recording_median(values):                           # the calibration's medians, one per (k, B)
    values = list(values)
    samples.append(values)
    return median(values)


g = torch.Generator().manual_seed(1)
for rep in range(3):
    samples.clear()
    draft_length.statistics.median = recording_median
    cal = draft_length.calibrate_step_costs(auto.engine, batch_sizes=[B])
    draft_length.statistics.median = median
    raw = dict(zip(cal, samples))                       # cal's keys in the order their medians were taken
    print(f"calibration {rep}: k8/k4 {cal[(8, B)] / cal[(4, B)]:.2f}")
    for k in range(9):
        print(f"  k={k}: median {cal[(k, B)]:.1f} ms; samples {[round(x, 1) for x in raw[(k, B)]]}")
    row = {}
    for k, llm in fixed.items():
        llm.engine.reset_step_timings()
        llm.generate(torch.randint(2, 1000, (B, 128), generator=g).tolist(),
                     SamplingParams(max_tokens=12 * (k + 1), ignore_eos=True))
        row[k] = step_costs(llm.engine.step_timings, k)[B]["step_ms"]
    print(f"fixed engines {rep}: " + ", ".join(f"k={k} {v:.1f} ms" for k, v in row.items())
          + f"; k8/k4 {row[8] / row[4]:.2f}", flush=True)
