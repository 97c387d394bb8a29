"""The depth policy's host time per decode step, in the running engine: perf_counter around the
scheduler's two calls and the policy's entry points, eager, concurrency 1, GSM8K test, 128 tokens,
mtp8 (FixedDraftLength) against auto, alternated, twice.
usage: OMP_NUM_THREADS=1 python experiments/concurrency/host_work/policy_host.py [num_prompts]"""
import collections
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))  # tools/host_setup.py
from host_setup import PARAMS as params, engine, gsm8k_prompts  # noqa: E402

prompts = gsm8k_prompts(12)
llms = {"mtp8": engine(8, compile=False), "auto": engine("auto", compile=False)}
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
    for attr in ["decide", "decide_depth", "observe_step", "observe_parts", "record", "observe",
                 "observe_overhead"]:
        if hasattr(e.scheduler.draft_length, attr):
            wrap(name, e.scheduler.draft_length, attr)
    llm.generate(prompts[:2], params, max_concurrency=1)
for _rep in range(2):
    for name, llm in llms.items():
        acc[name].clear()
        calls[name].clear()
        llm.generate(prompts, params, max_concurrency=1)
        steps = calls[name]["schedule"]
        print(name, "steps", steps,
              " ".join(f"{a}={1e6 * v / steps:.0f}us" for a, v in acc[name].most_common()), flush=True)
