"""The depth policy alone, driven as the scheduler drives it at concurrency 1 (k = 8 steady, 90%
acceptance, seeded): microseconds per step of each entry point (the least of 3 runs of STEPS
steps, default 3000), and with THRASH=1 a 1024^3 matmul before and after each step's learning,
as the engine's forwards do to the caches (1 run of 600 steps). Prints a digest of every
decision and the final summary: equal digests (at equal STEPS), equal decisions.
usage: python experiments/concurrency/host_work/replay.py [source root]   (THRASH=1 for the matmul)"""
import collections
import hashlib
import json
import os
import pathlib
import random
import sys
import time

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else str(pathlib.Path(__file__).resolve().parents[3]))
import torch  # noqa: E402

from mtpx.core.draft_length import AutoDraftLength  # noqa: E402

torch.set_num_threads(1)
_a, _b = torch.randn(1024, 1024), torch.randn(1024, 1024)
THRASH = (lambda: _a @ _b) if os.environ.get("THRASH") else None


def timed(T, name, f, *a, **k):
    t = time.perf_counter()
    r = f(*a, **k)
    T[name] += time.perf_counter() - t
    return r


def run(seed: int, steps: int):
    rng, K, T = random.Random(seed), 8, collections.Counter()
    costs = {(k, b): (8 + 0.6 * k) * (1 + 0.1 * (b - 1) * (1 + 0.3 * k)) for k in range(K + 1)
             for b in (1, 2, 4)}
    p = AutoDraftLength(K, costs)
    p.set_draft_costs({(k, b): 0.35 * k for k in range(K + 1) for b in (1, 2, 4)})
    p.set_prefill_cost(0.01)
    running, trace = [], []
    for _ in range(steps):
        if not running:
            c = p.decide_depth(1, depths=[], prompt_tokens=150, max_tokens=128)
            p.commit_depth(c)
            p.record_depth(c.depth)
            running.append([c.depth, 0])
        B = len(running)
        for d in sorted({r[0] for r in running}):
            c = timed(T, "decide_depth", p.decide_depth, B, d)
            p.commit_depth(c)
            for r in running:
                r[0] = c.depth if r[0] == d else r[0]
        depths = [r[0] for r in running]
        ch = timed(T, "decide", p.decide, B, max(depths), held=max(depths), depths=depths)
        p.commit(ch)
        k = ch.k
        trace.append(k)
        if THRASH:
            THRASH()
        ms = costs[(k, 1)] * rng.uniform(0.95, 1.1)
        timed(T, "observe_step", p.observe_step, k, B, ms, num_tokens=3, verify_ms=0.7 * ms,
              draft_depth=max(depths))
        timed(T, "observe_overhead", p.observe_overhead, B, 0.3)
        timed(T, "record", p.record, k, B, [a for _, a in running])
        for r in running:
            n, accepted = min(k, r[0]), 0
            while accepted < n and rng.random() < 0.9:
                accepted += 1
            timed(T, "observe", p.observe, n, accepted, 0, r[1])
            r[1] += 1 + accepted
        running = [r for r in running if r[1] < 128]
        if THRASH:
            THRASH()
    total = sum(T.values())
    digest = hashlib.sha1(json.dumps([trace, p.summary()], sort_keys=True).encode()).hexdigest()[:12]
    return total / steps, {n: round(1e6 * v / steps, 1) for n, v in T.most_common()}, digest, trace


steps = int(os.environ.get("STEPS", 600 if THRASH else 3000))
best = min((run(0, steps) for _ in range(1 if THRASH else 3)), key=lambda r: r[0])
print(f"{1e6 * best[0]:.1f} us/step in the policy {best[1]} digest {best[2]} k: "
      f"{dict(collections.Counter(best[3]))}")
