"""Per decode step of the compiled engine at concurrency 1: the runner's execute, verify and draft
ms (medians) by (the step's k, the most drafts a request verified), mtp8 against auto, alternated,
twice; and the scheduler's two calls (host work). GSM8K test, 128 tokens, 1 thread.
usage: OMP_NUM_THREADS=1 [ROOT=source tree] [COMPILE=0] \
    python experiments/concurrency/host_work/step_by_k.py [num_prompts]"""
import collections
import os
import pathlib
import sys
import statistics
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))  # tools/host_setup.py
from host_setup import PARAMS as params, engine, gsm8k_prompts, timed_steps  # noqa: E402

prompts = gsm8k_prompts(24)
compile = bool(int(os.environ.get("COMPILE", "1")))
llms = {"mtp8": engine(8, compile), "auto": engine("auto", compile)}
steps = {n: [] for n in llms}


def record(name, out, r, dt):
    if out.decodes and not out.prefills and r.timing is not None:
        steps[name].append((out.num_speculative_tokens, max(d.num_draft_tokens for d in out.decodes), dt,
                            r.timing.verify_s, r.timing.draft_s))


host = timed_steps(llms, record)
for llm in llms.values():
    llm.generate(prompts[:2], params, max_concurrency=1)
for _rep in range(2):
    for name, llm in llms.items():
        steps[name].clear()
        host[name].clear()
        t = time.perf_counter()
        llm.generate(prompts, params, max_concurrency=1)
        wall = time.perf_counter() - t
        print(name, f"wall {wall:.3f} s", {a: round(v, 3) for a, v in host[name].items()}, flush=True)
        by = collections.defaultdict(list)
        for k, nd, dt, v, d in steps[name]:
            by[(k, nd)].append((dt, v, d))
        for key, xs in sorted(by.items()):
            med = [1e3 * statistics.median(x[i] for x in xs) for i in range(3)]
            print(f"   k {key[0]} verified {key[1]}: {len(xs)} steps, execute {med[0]:.2f} verify "
                  f"{med[1]:.2f} draft {med[2]:.2f} ms", flush=True)
