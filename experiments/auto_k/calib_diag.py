"""The raw start-up calibration at one batch size beside fixed-k engines' steps, eager, demo, in
one process, twice per prompt length (the noise of one calibration against the next).

    OMP_NUM_THREADS=2 python experiments/auto_k/calib_diag.py BATCH LENGTHS   # e.g. 16 128,256
"""
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.auto_k import calibration  # noqa: E402
from mtpx.auto_k.store import save_step_costs  # noqa: E402
from mtpx.auto_k.costs import step_costs  # noqa: E402


def calibrate_step_costs(eng, **kw):
    """mtpx.auto_k.calibration.calibrate_step_costs over the engine's Engine.time_decode_steps (the
    start-up calibration's measure; an eager engine, each k its own step). Returns {(k, B): ms}."""
    def measure(b, ks, context_len, rounds, seed=0, draft=None):
        return eng.time_decode_steps(b, ks, context_len, rounds, seed=seed, draft=draft)
    return calibration.calibrate_step_costs(measure, eng.num_speculative_tokens, eng.config.max_num_seqs,
                                            **kw)


torch.set_num_threads(2)
B, lens = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
M = str(ROOT / "checkpoints" / "demo")
fake = Path(tempfile.mkdtemp()) / "costs.json"        # skips the LLM's own start-up calibration
save_step_costs(fake, {(k, B): 10.0 + k for k in range(9)}, {})
auto = LLM(model=M, spec="mtp8", num_speculative_tokens="auto", max_num_seqs=B, max_model_len=1024,
           cost_model_file=fake)
fixed = {k: LLM(model=M, spec=None if k == 0 else "mtp8", num_speculative_tokens=k or None, max_num_seqs=B,
                max_model_len=1024) for k in (0, 2, 4, 8)}
g = torch.Generator().manual_seed(1)
res = {}
for _ in range(2):
    for L in lens:
        cal = calibrate_step_costs(auto.engine, batch_sizes=[B], context_len=L)  # prompt_len=L before d4d6d20
        res.setdefault(f"calibration L={L}", []).append([round(cal[(k, B)], 1) for k in range(9)])
        row = {}
        for k, llm in fixed.items():
            prompts = torch.randint(2, 1000, (B, L), generator=g).tolist()
            llm.generate(prompts, SamplingParams(max_tokens=12 * (k + 1), ignore_eos=True))
            c = step_costs(llm.engine.step_timings, k).get(B)
            row[k] = None if c is None else round(c["step_ms"], 1)
        res.setdefault(f"fixed engines L={L}", []).append(row)
        print(json.dumps(res), flush=True)
