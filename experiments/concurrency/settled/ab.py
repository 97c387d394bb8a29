"""Settled decisions against deciding every step, in one process: mtp8, auto (settled_interval 4,
the default) and auto deciding every step (settled_interval 1), the demo at concurrency 1, GSM8K
test, 128 tokens, 1 thread, alternated in rotated order, PASSES passes (default 3): each engine's
wall, the scheduler's two calls per decode step and the median execute ms of its k = 8 steps.
usage: OMP_NUM_THREADS=1 [COMPILE=0] [PASSES=3] python experiments/concurrency/settled/ab.py [num_prompts]"""
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from host_setup import PARAMS as params, engine, gsm8k_prompts, timed_steps  # noqa: E402

prompts = gsm8k_prompts(24)
compile = bool(int(os.environ.get("COMPILE", "1")))
llms = {"mtp8": engine(8, compile), "auto": engine("auto", compile),
        "auto_every_step": engine("auto", compile)}
llms["auto_every_step"].engine.scheduler.draft_length.settled_interval = 1
k8 = {n: [] for n in llms}


def record(name, out, r, dt):
    host[name]["steps"] += 1
    if out.decodes and not out.prefills and out.num_speculative_tokens == 8:
        k8[name].append(dt)


host = timed_steps(llms, record)
for llm in llms.values():
    llm.generate(prompts[:2], params, max_concurrency=1)
names = list(llms)
for p in range(int(os.environ.get("PASSES", 3))):
    for name in names[p % 3:] + names[:p % 3]:
        llm = llms[name]
        host[name].clear()
        k8[name].clear()
        t = time.perf_counter()
        llm.generate(prompts, params, max_concurrency=1)
        wall = time.perf_counter() - t
        h = host[name]
        print(f"pass {p} {name:16s} wall {wall:7.3f} s  steps {h['steps']}  scheduler "
              f"{1e6 * (h['schedule'] + h['update_from_output']) / h['steps']:.0f} us/step  "
              f"k=8 execute median {1e3 * statistics.median(k8[name]):.2f} ms ({len(k8[name])} steps)",
              flush=True)
