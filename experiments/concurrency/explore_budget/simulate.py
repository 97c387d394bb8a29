"""Automatic k's policy (mtpx/core/draft_length.py) driven through decode steps whose costs and
acceptance are simulated: which explore_budget keeps exploring from costing the batch. Costs
are a verification part verify(k) plus a draft-round part draft(depth), the depth being the
step's k or the deepest held depth (the catch-up); each request accepts each draft with
probability p; a request finishing its 128 tokens is replaced by one admitted at `depth`. The
policy learns from the steps as the scheduler feeds it (observe_step / observe_parts, observe,
record), the first requests admitted as the engine admits them (`depth`). Prints the simulated
goodput over that of the best fixed k, median of the seeds.

usage: python experiments/concurrency/explore_budget/simulate.py [BUDGETS] [SCENARIOS]
(each budget without and with optimistic_falls)
"""
from __future__ import annotations

import random
import statistics
import sys

from mtpx.core.draft_length import AutoDraftLength

SCENARIOS = {   # name: (verify(k) ms, draft(depth) ms, batch size, acceptance per draft or per position)
    # the compiled batch-16 step with buckets [0, 8]: every k >= 1 costs k = 8's step (about 5x
    # plain, held_depth's calibration), of which the 8-module draft round is about 50 ms
    "compiled_c16_p83": (lambda k: 43.0 if k == 0 else 170.0, lambda d: 0.0 if d == 0 else 50.0, 16, 0.83),
    # the compiled batch-16 step with buckets [0, 4, 8] (compiled_c16_buckets' calibration: k = 1-4
    # cost k = 4's step, 3.3x plain, k = 5-8 5.5x), where k = 4 pays at p = 0.85 and the prior
    # (0.7) says it does not
    "compiled_c16_buckets_p85": (lambda k: 34.0 if k == 0 else 99.0 if k <= 4 else 160.0,
                                 lambda d: 0.0 if d == 0 else 13.0 if d <= 4 else 27.0, 16, 0.85),
    # the compiled batch-4 step with buckets [0, 4, 8] (compiled_c4's calibration: k = 1-4 cost
    # 39 ms, k = 5-8 58 ms, the draft rounds 6 and 16 ms), where k = 4 beats k = 8 (added in
    # ../held_rise)
    "compiled_c4_buckets_p85": (lambda k: 18.2 if k == 0 else 33.1 if k <= 4 else 42.1,
                                lambda d: 0.0 if d == 0 else 6.2 if d <= 4 else 15.6, 4, 0.85),
    # the eager batch-4 step (held_rise's AVX-512 calibration, the draft round 1.22 ms a module)
    # with the demo's falling acceptance per position, where k = 4 and k = 8 are within 1% (added
    # in ../held_rise)
    "eager_c4_demo": (lambda k: [11.67, 20.18, 21.26, 22.35, 23.54, 24.76, 25.98, 27.35, 28.14][k],
                      lambda d: 1.22 * d, 4, [0.80, 0.85, 0.86, 0.87, 0.84, 0.82, 0.80, 0.78]),
    # an eager batch-64 step, where only a high acceptance makes k = 1 pay
    "eager_b64_p90": (lambda k: 100.0 + 60 * k, lambda d: 20.0 * d, 64, 0.90),
    "eager_b64_p75": (lambda k: 100.0 + 60 * k, lambda d: 20.0 * d, 64, 0.75),
    # an eager batch-16 step, where k = 3-4 pays about 1.2x
    "eager_b16_p83": (lambda k: 44.0 + 18 * k, lambda d: 6.0 * d, 16, 0.83),
}


def simulate(budget, verify, draft, B, p, steps=2000, length=128, max_k=8, seed=0, **options) -> float:
    """Simulated output tokens per ms of `steps` decode steps, over plain decoding's; options:
    AutoDraftLength's."""
    rng = random.Random(seed)
    policy = AutoDraftLength(max_k, {(k, B): verify(k) + draft(k) for k in range(max_k + 1)},
                             explore_budget=budget, **options)
    requests = [[rng.randrange(length), policy.depth(B)] for _ in range(B)]   # [output tokens, depth]
    ms = tokens = 0.0
    proposed = max_k                                                 # drafts the step before proposed
    for _ in range(steps):
        for r in requests:
            if r[0] >= length:
                r[0], r[1] = 0, policy.depth(B, depths=[q[1] for q in requests if q is not r])
        for r in requests:
            if r[1] > 0:
                choice = policy.decide_depth(B, r[1])
                policy.commit_depth(choice)
                r[1] = choice.depth
        depths = [r[1] for r in requests]
        choice = policy.decide(B, max(depths), held=max(depths), depths=depths)
        policy.commit(choice)
        k, held = choice.k, max(choice.k, max(depths))
        v, d = verify(proposed), draft(held)
        ms += v + d
        if proposed == held:
            policy.observe_step(k, B, v + d, verify_ms=v, draft_depth=held)
        else:
            policy.observe_parts(proposed, held, B, v, d)
        for r in requests:
            n, accepted = min(proposed, r[1]), 0
            while accepted < n and rng.random() < (p[accepted] if isinstance(p, list) else p):
                accepted += 1
            if n:
                policy.observe(n, accepted, age=r[0])
            r[0] += accepted + 1
            tokens += accepted + 1
        policy.record(k, B, [r[0] for r in requests])
        proposed = k
    return tokens / ms * verify(0) / B


def best_fixed(verify, draft, p, max_k=8) -> tuple[int, float]:
    """The best fixed k and its goodput over plain decoding's (expected tokens per step over
    its cost)."""
    def tokens(k):
        ps = p if isinstance(p, list) else [p] * max_k
        total = survive = 1.0
        for q in ps[:k]:
            survive *= q
            total += survive
        return total
    return max(((k, tokens(k) / (verify(k) + draft(k)) * verify(0)) for k in range(max_k + 1)),
               key=lambda x: x[1])


def main() -> None:
    budgets = [float(b) for b in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1.0, 0.05, 0.01, 0.0]
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SCENARIOS)
    cols = [(b, o) for o in (False, True) for b in budgets]
    print("| scenario | best fixed k (x plain) | " + " | ".join(
        f"budget {b:g}{', optimistic falls' if o else ''}" for b, o in cols) + " |")
    print("|---|---|" + "---:|" * len(cols))
    for name in names:
        verify, draft, B, p = SCENARIOS[name]
        k, best = best_fixed(verify, draft, p)
        cells = [statistics.median(simulate(b, verify, draft, B, p, seed=s,
                                            optimistic_falls=o) for s in range(2)) / best
                 for b, o in cols]
        print(f"| {name} | {k} ({best:.3f}x) | " + " | ".join(f"{c:.3f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
