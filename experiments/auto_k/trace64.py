"""What `num_speculative_tokens=auto` decides at concurrency 64 on GSM8K: the first 128 test
prompts in two chunks of 64 (at most 128 tokens, greedy), every depth given at admission or
lowered and every change of a step's k, with the first four acceptance estimates they were
decided from. PATIENCE (default: the policy's) sets AutoDraftLength.patience (1: the policy
before patience existed). Step costs from COST_FILE (spec.cost_model_file; e.g. run 12's,
experiments/auto_k/run12/step_costs.json), else the step-cost cache ($MTPX_CACHE_DIR).

    OMP_NUM_THREADS=2 python experiments/auto_k/trace64.py [PATIENCE|default] [COST_FILE]
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.schema import data_dir  # noqa: E402  (MTPX_DATA_DIR, else conf/config.yaml's data_dir)
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

torch.set_num_threads(2)
prompts = [format_prompt(r["question"]) for r in load_gsm8k(data_dir(ROOT / "conf") / "gsm8k" / "test.jsonl")]
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens="auto",
          max_num_seqs=64, max_model_len=1024, cost_model_file=sys.argv[2] if len(sys.argv) > 2 else None)
policy = llm.engine.draft_length
if len(sys.argv) > 1 and sys.argv[1] != "default":
    policy.patience = int(sys.argv[1])
print(f"patience {policy.patience}; step costs {llm.calibration['source']}")
choose, depth = policy.choose, policy.depth
last = {}


def estimates():
    return [round(p, 2) for p in policy.acceptance[:4]]


def traced_choose(batch_size, max_k=None):
    k = choose(batch_size, max_k)
    if last.get("k") != k:
        print(f"  step k {last.get('k')} -> {k} (batch {batch_size}, deepest request {max_k}); p = "
              f"{estimates()}")
        last["k"] = k
    return k


def traced_depth(batch_size, current=None):
    d = depth(batch_size, current)
    if current is None and last.get("admitted") != d:
        print(f"  admitted at depth {d} (batch {batch_size}); p = {estimates()}")
        last["admitted"] = d
    if current is not None and d != current:
        print(f"  running depth {current} -> {d} (batch {batch_size}); p = {estimates()}")
    return d


policy.choose, policy.depth = traced_choose, traced_depth
for c in range(2):
    print(f"chunk {c}")
    llm.generate(prompts[c * 64:(c + 1) * 64], SamplingParams(max_tokens=128))
    print(f"  k per step so far {dict(sorted(policy.histogram.items()))}, depths given "
          f"{dict(policy.depth_histogram)}")
