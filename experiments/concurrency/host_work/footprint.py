"""Does the policy's host work slow the forwards after it? mtp8 compiled at concurrency 1, its
scheduler's schedule() followed by one step of an automatic-k policy driven as replay.py drives it
(a policy of its own, not the engine's: mtp8's decisions are unchanged), by nothing, by a
Python loop of about the policy's time that touches almost no memory (the control: time alone,
not the caches), or by the policy's step handed to a second thread while the forward runs
(joined before the next schedule(): what an asynchronous policy would cost), alternated, twice
(MODES: their order): the runner's execute ms (median of the k = 8 steps verifying 8), the wall.
usage: OMP_NUM_THREADS=1 python experiments/concurrency/host_work/footprint.py [num_prompts]"""
import os
import pathlib
import sys
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))  # tools/host_setup.py
from host_setup import PARAMS as params, engine, gsm8k_prompts  # noqa: E402

from mtpx.core.draft_length import AutoDraftLength

prompts = gsm8k_prompts(24)
llm = engine(8, compile=True)
e = llm.engine
K = 8
costs = {(k, 1): 8 + 0.6 * k for k in range(K + 1)}
policy = AutoDraftLength(K, costs)
policy.set_draft_costs({(k, 1): 0.35 * k for k in range(K + 1)})
rng, state = random.Random(0), {"age": 0, "on": "no", "host": 0.0, "pending": None}
pool = ThreadPoolExecutor(1)
SPIN_S = float(os.environ.get("SPIN_MS", "0.23")) / 1e3    # about the policy step's time


def policy_step():
    """One decode step of the scheduler's calls into an automatic-k policy (replay.py's)."""
    c = policy.decide_depth(1, 8)
    policy.commit_depth(c)
    ch = policy.decide(1, 8, held=8, depths=[8])
    policy.commit(ch)
    ms = costs[(ch.k, 1)] * rng.uniform(0.95, 1.1)
    policy.observe_step(ch.k, 1, ms, num_tokens=5, verify_ms=0.7 * ms, draft_depth=8)
    policy.observe_overhead(1, 0.3)
    policy.record(ch.k, 1, [state["age"] % 128])
    accepted = sum(1 for _ in range(ch.k) if rng.random() < 0.9)
    policy.observe(ch.k, accepted, 0, state["age"] % 128)
    state["age"] += 1 + accepted


schedule, execute, steps = e.scheduler.schedule, e.runner.execute, []


def scheduled():
    if state["pending"] is not None:          # the thread's step of the step before
        t = time.perf_counter()
        state["pending"].result()
        state["host"] += time.perf_counter() - t
        state["pending"] = None
    out = schedule()
    t = time.perf_counter()
    if state["on"] == "yes":
        policy_step()
    elif state["on"] == "spin":
        end = t + SPIN_S
        while time.perf_counter() < end:
            pass
    elif state["on"] == "thread":
        state["pending"] = pool.submit(policy_step)
    state["host"] += time.perf_counter() - t
    return out


def executed(out):
    t = time.perf_counter()
    r = execute(out)
    if out.decodes and not out.prefills and max(d.num_draft_tokens for d in out.decodes) == 8:
        steps.append(time.perf_counter() - t)
    return r


e.scheduler.schedule, e.runner.execute = scheduled, executed
llm.generate(prompts[:2], params, max_concurrency=1)
for _rep in range(2):
    for on in os.environ.get("MODES", "no yes thread spin").split():
        state["on"], state["host"] = on, 0.0
        steps.clear()
        t = time.perf_counter()
        llm.generate(prompts, params, max_concurrency=1)
        wall = time.perf_counter() - t
        print(f"policy step after schedule: {on:6} wall {wall:.3f} s, of it the main thread's policy work "
              f"{state['host']:.3f} s; execute of {len(steps)} k = 8 steps: median "
              f"{1e3 * statistics.median(steps):.3f} ms, mean {1e3 * statistics.fmean(steps):.3f} ms",
              flush=True)
