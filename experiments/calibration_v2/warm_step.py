"""Does the step before a timed calibration step change its cost? At one batch size, k = 0 and
k = 8 timed (a) alternated call by call with every other k (the calibration's order) and (b)
right after an untimed call at the same k (as in a run, where consecutive steps share k), in
turns, 3 times each. Eager, demo.

    OMP_NUM_THREADS=2 python experiments/calibration_v2/warm_step.py BATCH
"""
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM  # noqa: E402
from mtpx.engine.draft_length import save_step_costs  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1])
fake = Path(tempfile.mkdtemp()) / "costs.json"          # skips the LLM's own start-up calibration
save_step_costs(fake, {(k, 1): 10.0 + k for k in range(9)}, {})
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
          max_num_seqs=B, cost_model_file=fake)
engine = llm.engine
res = {"alternated": {0: [], 8: []}, "after the same k": {0: [], 8: []}}
for _ in range(3):
    t = engine.time_decode_steps(B, list(range(9)), 192, rounds=8)
    for k in (0, 8):
        res["alternated"][k].append(statistics.median(t[k]))
    for k in (0, 8):
        t = engine.time_decode_steps(B, [k], 192, rounds=8)
        res["after the same k"][k].append(statistics.median(t[k]))
for how, by_k in res.items():
    print(f"batch {B}, {how}: k=0 {[round(x, 2) for x in by_k[0]]} ms, k=8 {[round(x, 2) for x in by_k[8]]} ms; "
          f"k=8 / k=0 {[round(b / a, 2) for a, b in zip(by_k[0], by_k[8])]}")
