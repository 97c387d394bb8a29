"""The depth policy's host time per decode step, in the running engine: perf_counter around the
scheduler's two calls and the policy's entry points, eager, concurrency 1, GSM8K test, 128 tokens,
mtp8 (FixedDraftLength) against auto, alternated, twice.
usage: OMP_NUM_THREADS=1 python experiments/concurrency/host_work/policy_host.py [num_prompts]"""
import collections
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from mtpx import LLM, SamplingParams  # noqa: E402
from mtpx.data.gsm8k import format_prompt, load_gsm8k  # noqa: E402

DATA = pathlib.Path(os.environ.get("MTPX_DATA_DIR", ROOT.parent / "shared" / "data"))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 12
prompts = [format_prompt(r["question"]) for r in load_gsm8k(DATA / "gsm8k" / "test.jsonl")[:N]]
params = SamplingParams(max_tokens=128, temperature=0.0)
common = dict(threads=1, max_num_seqs=1, max_model_len=1024, compile=False)
llms = {"mtp8": LLM(str(ROOT / "checkpoints/demo"), spec="mtp8", num_speculative_tokens=8, **common),
        "auto": LLM(str(ROOT / "checkpoints/demo"), spec="mtp8", num_speculative_tokens="auto", **common)}
acc = {n: collections.Counter() for n in llms}
calls = {n: collections.Counter() for n in llms}


def wrap(name, obj, attr):
    f = getattr(obj, attr)

    def timed(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        acc[name][attr] += time.perf_counter() - t
        calls[name][attr] += 1
        return r
    setattr(obj, attr, timed)


for name, llm in llms.items():
    e = llm.engine
    for attr in ["schedule", "update_from_output"]:
        wrap(name, e.scheduler, attr)
    for attr in ["decide", "decide_depth", "observe_step", "observe_parts", "record", "observe", "observe_overhead"]:
        if hasattr(e.scheduler.draft_length, attr):
            wrap(name, e.scheduler.draft_length, attr)
    llm.generate(prompts[:2], params, max_concurrency=1)
for _rep in range(2):
    for name, llm in llms.items():
        acc[name].clear()
        calls[name].clear()
        llm.generate(prompts, params, max_concurrency=1)
        steps = calls[name]["schedule"]
        print(name, "steps", steps, " ".join(f"{a}={1e6 * v / steps:.0f}us" for a, v in acc[name].most_common()),
              flush=True)
