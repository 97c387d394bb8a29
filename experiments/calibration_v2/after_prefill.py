"""Decode-step ms right after fresh requests' prefill, step by step, at one batch size: does the
start-up calibration's sample (the first steps after a prefill) read the step's cost in a run?
Eager, demo, auto engine forced to each k in turn, fresh random prompts per k, two rounds.

    OMP_NUM_THREADS=2 python experiments/calibration_v2/after_prefill.py BATCH [STEPS]
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
from mtpx.engine.request import Request  # noqa: E402
from mtpx.engine.sampling_params import SamplingParams  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1])
N = int(sys.argv[2]) if len(sys.argv) > 2 else 16
fake = Path(tempfile.mkdtemp()) / "costs.json"          # skips the LLM's own start-up calibration
save_step_costs(fake, {(k, B): 10.0 + k for k in range(9)}, {})
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
          max_num_seqs=B, cost_model_file=fake, record_step_timings=True)
engine, policy = llm.engine, llm.engine.draft_length
g = torch.Generator().manual_seed(0)
vocab = llm.model.cfg.vocab_size
params = SamplingParams(max_tokens=400, ignore_eos=True)
next_id = -1
for rnd in range(2):
    for k in (0, 4, 8):
        policy.forced = k
        reqs = []
        for _ in range(B):
            reqs.append(Request(next_id, torch.randint(2, vocab, (128,), generator=g).tolist(), params))
            engine.add_request(reqs[-1])
            next_id -= 1
        ms = []
        while len(ms) < N:
            engine.reset_step_timings()
            engine.step()
            t = engine.step_timings[-1]
            if t.num_prefill_tokens:
                continue
            ms.append(1e3 * (t.verify_s + t.draft_s))
        for r in reqs:
            engine.abort(r)
        engine.pop_aborted()
        first, rest = ms[:4], ms[4:]
        print(f"round {rnd} k={k}: first 4 steps {[round(x, 1) for x in first]}, "
              f"median of steps 5-{N} {statistics.median(rest):.1f} ms "
              f"(first 4 median / later median {statistics.median(first) / statistics.median(rest):.2f})",
              flush=True)
