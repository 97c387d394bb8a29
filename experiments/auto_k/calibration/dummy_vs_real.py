"""Does a calibration step (Engine.time_decode_steps: the positions before the window taken as
computed, never prefilled) cost what a real decode step costs? At one batch size, for k = 0, 4
and 8 in turn, twice: B fresh random prompts of CONTEXT tokens are prefilled and decode with
every step forced to k (each request at depth k), their first 6 pure decode steps timed; then
the calibration's step of B requests at the context those steps ran at, 6 rounds. Eager, demo.

    OMP_NUM_THREADS=2 python experiments/auto_k/calibration/dummy_vs_real.py BATCH [CONTEXT]
"""
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM  # noqa: E402
from mtpx.auto_k.store import save_step_costs  # noqa: E402
from mtpx.core.request import Request  # noqa: E402
from mtpx.core.sampling_params import SamplingParams  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1])
ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 192
fake = Path(tempfile.mkdtemp()) / "costs.json"          # skips the LLM's own start-up calibration
save_step_costs(fake, {(k, 1): 10.0 + k for k in range(9)}, {})
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
          max_num_seqs=B, cost_model_file=fake, record_step_timings=True)
engine, policy = llm.engine, llm.engine.draft_length
g = torch.Generator().manual_seed(0)
vocab = llm.model.cfg.vocab_size
params = SamplingParams(max_tokens=400, ignore_eos=True)
next_id = 0
ratios = []
for rnd in range(2):
    for k in (0, 4, 8):
        policy.forced = k
        reqs = []
        for _ in range(B):
            reqs.append(Request(next_id, torch.randint(2, vocab, (ctx,), generator=g).tolist(), params))
            engine.add_request(reqs[-1])
            next_id += 1
        real, contexts = [], []
        while len(real) < 6:
            contexts.append(sum(r.num_tokens for r in reqs) / B)
            engine.reset_step_timings()
            engine.step()
            t = engine.step_timings[-1]
            if t.num_prefill_tokens:
                continue
            real.append(1e3 * (t.verify_s + t.draft_s))
        for r in reqs:
            engine.abort(r)
        engine.pop_aborted()
        policy.forced = None
        at = round(statistics.median(contexts[-6:]))
        dummy = engine.time_decode_steps(B, [k], at, rounds=6)[k]
        ratios.append(statistics.median(dummy) / statistics.median(real))
        print(f"round {rnd} batch {B} k={k}: real steps median {statistics.median(real):.1f} ms "
              f"(mean context {at}), calibration steps {statistics.median(dummy):.1f} ms; "
              f"calibration / real {ratios[-1]:.2f}", flush=True)
print(f"calibration / real over the {len(ratios)} pairs: median {statistics.median(ratios):.2f}, "
      f"{min(ratios):.2f}-{max(ratios):.2f}")
