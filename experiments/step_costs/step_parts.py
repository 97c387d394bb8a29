"""Where a multi-module MTP decode step's time goes at batch B and fixed k (eager, demo): wall-clock
timers around the model runner's decode step and the calls inside it (the verification forward,
the verification, the Gated DeltaNet commit, the draft loop's plan, each module forward summed,
the draft logits, the draft window writes), over the pure decode steps of all B requests; B
random 160-token prompts, 40 new tokens each, twice; medians over those steps, ms.

    OMP_NUM_THREADS=2 python experiments/step_costs/step_parts.py B K
"""
import collections
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import mtpx.engine.model_runner as model_runner  # noqa: E402
import mtpx.spec_decode.multi_module as multi_module  # noqa: E402
from mtpx import LLM, SamplingParams  # noqa: E402

torch.set_num_threads(2)
B, K = int(sys.argv[1]), int(sys.argv[2])
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=K,
          max_num_seqs=B, max_model_len=1024, record_step_timings=True)
seconds = collections.defaultdict(float)


def timed(name, fn):
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds[name] += time.perf_counter() - t0
        return out
    return call


runner = llm.engine.runner
spec = runner.speculator
model_runner.verify_forward = timed("verification forward", model_runner.verify_forward)
model_runner.verify = timed("verification", model_runner.verify)
runner.cache.commit_recurrent = timed("commit", runner.cache.commit_recurrent)
spec.plan = timed("draft plan", spec.plan)
spec.draft_loop = timed("draft loop", spec.draft_loop)
multi_module.run_module = timed("module forwards", multi_module.run_module)
llm.model.draft_logits = timed("draft logits", llm.model.draft_logits)
spec.window.write = timed("draft window writes", spec.window.write)
runner._decode = timed("decode step", runner._decode)
per_step = collections.defaultdict(list)
step = llm.engine.step


def counted_step():
    seconds.clear()
    out = step()
    t = llm.engine.step_timings[-1] if llm.engine.step_timings else None
    if t is not None and t.num_decodes == B and t.num_prefill_tokens == 0:
        for name, s in seconds.items():
            per_step[name].append(1e3 * s)
    return out


llm.engine.step = counted_step
prompts = torch.randint(2, 2048, (B, 160), generator=torch.Generator().manual_seed(0)).tolist()
for _ in range(2):
    llm.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
print(f"batch {B}, k = {K}, {len(per_step['decode step'])} steps: "
      + ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in per_step.items()))
