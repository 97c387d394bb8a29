"""Automatic k's decisions on a replayed trace (tests/test_auto_k_replay.py).

`run(scenario, inputs)` drives the real Scheduler and automatic k's policy with a fake runner that
returns RunnerOutput-shaped results: each request round's accepted drafts and each step's timing
parts (verify, draft, overhead, prefill module ms). With inputs None it draws them from a seeded
RNG over the demo's eager step costs (experiments/auto_k/conc16: mtp8 at batch 1, 4, 16) and
per-request acceptance; with inputs it replays them. Returns (inputs, decisions): every step's
k, the depths of the requests admitted in it, the running depths that fell, and the drafts each
decode verifies (the per-request allocation).

The fixture tests/data/auto_k_trace.json was recorded with the code before automatic k became
one package (commit 6c6300f):

    cd /tmp && PYTHONPATH=/work/base python /work/main/tests/auto_k_trace.py \
        /work/main/tests/data/auto_k_trace.json

but c16_per_request, recorded again with the tie rule of issue 72 (tests/test_auto_k_replay.py).
"""
from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field

from mtpx.core.kv_cache_manager import KVCacheManager
from mtpx.core.request import Request
from mtpx.core.sampling_params import SamplingParams
from mtpx.core.scheduler import Scheduler

# eager demo, mtp8 (experiments/auto_k/conc16): {batch size: step ms at k = 0 .. 8}
COSTS = {1: [14.34, 17.55, 18.69, 19.71, 20.61, 21.39, 22.05, 22.59, 23.00],
         4: [15.45, 21.34, 22.72, 24.25, 25.93, 27.77, 29.76, 31.91, 34.21],
         16: [19.00, 35.15, 38.09, 41.56, 45.58, 50.15, 55.26, 60.91, 67.11]}
MAX_K = 8
ACCEPTANCE = [0.78, 0.84, 0.85, 0.87, 0.88, 0.67, 0.9, 0.5]   # conditional, per draft position

SCENARIOS = {
    # name: (concurrency, requests, depth per request, per-request k, seed)
    "c1": (1, 8, True, False, 1),
    "c4": (4, 24, True, False, 4),
    "c4_single_module": (4, 16, False, False, 5),
    "c16_per_request": (16, 48, True, True, 16),
}


@dataclass
class Result:
    token_ids: list
    num_draft_tokens: int = 0
    num_accepted: int = 0
    draft_token_ids: list = field(default_factory=list)
    draft_probs: object = None
    num_final_tokens: int = 0
    logit_gaps: object = None
    logprobs: object = None
    prompt_logprobs: object = None
    leaf_rank: int = 0


@dataclass
class Timing:
    num_decodes: int
    num_draft_tokens: int
    num_prefill_tokens: int
    prefill_s: float
    verify_s: float
    draft_s: float
    prefill_draft_s: float = 0.0
    num_prefill_module_tokens: int = 0
    catch_up_s: float = 0.0
    num_catch_up_module_tokens: int = 0


@dataclass
class Output:
    results: dict
    timing: Timing


class Clock:
    """A scripted time.perf_counter: every call reads `now` (the scheduler's step clock)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _cost(k: int, batch: int) -> float:
    sizes = sorted(COSTS)
    if batch >= sizes[-1]:
        return COSTS[sizes[-1]][k] * batch / sizes[-1]
    i = next(i for i, b in enumerate(sizes) if b >= batch)
    if sizes[i] == batch or i == 0:
        return COSTS[sizes[i]][k]
    b0, b1 = sizes[i - 1], sizes[i]
    w = (batch - b0) / (b1 - b0)
    return (1 - w) * COSTS[b0][k] + w * COSTS[b1][k]


def _draft_ms(modules: int, batch: int) -> float:
    """The draft round of `modules` modules: 60% of the cost above plain decoding."""
    return 0.6 * (_cost(modules, batch) - _cost(0, batch)) if modules else 0.0


def policy_for(depth_per_request: bool, per_request: bool):
    """Automatic k over 0 .. MAX_K with the table's costs (the code under test's API)."""
    step_costs = {(k, b): ms for b, row in COSTS.items() for k, ms in enumerate(row)}
    draft_costs = {(k, b): _draft_ms(k, b) for b in COSTS for k in range(MAX_K + 1)}
    try:
        from mtpx.auto_k import AutoDraftLength
        return AutoDraftLength(MAX_K, step_costs, draft_costs=draft_costs, prefill_cost=0.02,
                               per_request=per_request)
    except ImportError:                          # the code before automatic k's package
        from mtpx.auto_k.policy import AutoDraftLength
        policy = AutoDraftLength(MAX_K, step_costs)
        policy.set_draft_costs(draft_costs)
        policy.set_prefill_cost(0.02)
        policy.per_request = per_request
        return policy


def run(name: str, inputs: list | None = None) -> tuple[list, list]:
    """Drive scenario `name` (SCENARIOS); inputs: the recorded step inputs to replay (None: draw
    them). Returns (inputs, decisions), one entry per step."""
    concurrency, num_requests, depth_per_request, per_request, seed = SCENARIOS[name]
    rng = random.Random(seed)
    policy = policy_for(depth_per_request, per_request)
    kv = KVCacheManager(4096, 16, False, MAX_K)
    max_len = 1024 + 2 * MAX_K + 2
    scheduler = Scheduler(kv, concurrency, 512, policy, max_len, 1024, MAX_K, depth_per_request)
    clock = None
    if hasattr(scheduler, "clock"):              # the scheduler measures the step's wall time
        clock = scheduler.clock = Clock()
    skill = {}
    for i in range(num_requests):
        prompt = [2 + (7 * i + j) % 500 for j in range(rng.randint(20, 300))]
        scheduler.add(Request(i, prompt, SamplingParams(max_tokens=rng.randint(24, 160), ignore_eos=True)))
        # the first half accepts well, the second worse: k and the depths fall mid-run
        skill[i] = rng.uniform(0.85, 1.1) if i < num_requests // 2 else rng.uniform(0.4, 0.75)
    recorded, decisions, step = [], [], 0
    while scheduler.has_work():
        before = {r.index: r.draft_depth for r in scheduler.running}
        if clock is not None:
            clock.now = 10.0 * step
        out = scheduler.schedule()
        k = out.num_speculative_tokens
        admitted = [[p.request.index, p.request.draft_depth] for p in out.prefills if p.new]
        lowered = sorted([i, r.draft_depth] for r in scheduler.running
                         if (i := r.index) in before and r.draft_depth < before[i])
        verified = [[d.request.index, d.num_draft_tokens] for d in out.decodes]
        decisions.append({"k": k, "admitted": admitted, "lowered": lowered, "verified": verified})
        step_in = inputs[step] if inputs is not None else _draw(rng, out, skill, depth_per_request)
        recorded.append(step_in)
        verify_ms, draft_ms, prefill_ms, overhead_ms = step_in["ms"]
        results = {}
        for p in out.prefills:
            drafts = min(k, p.request.draft_depth) if p.is_last else 0
            results[p.request.index] = Result([1] if p.is_last else [], draft_token_ids=[1] * drafts)
        for d in out.decodes:
            n = min(step_in["accepted"][str(d.request.index)], d.num_draft_tokens)
            results[d.request.index] = Result([1] * (n + 1), d.num_draft_tokens, n,
                                              [1] * min(k, d.request.draft_depth))
        module_tokens = sum(p.num_tokens * p.request.draft_depth for p in out.prefills)
        timing = Timing(len(out.decodes), sum(d.num_draft_tokens for d in out.decodes),
                        sum(p.num_tokens for p in out.prefills), 0.0, verify_ms / 1e3, draft_ms / 1e3,
                        prefill_ms / 1e3, module_tokens if depth_per_request else 0)
        if clock is not None:
            clock.now = 10.0 * step + (verify_ms + draft_ms + overhead_ms) / 1e3
        scheduler.update_from_output(out, Output(results, timing))
        if clock is None and out.decodes and not out.prefills:     # the code before: Engine.step's call
            policy.observe_overhead(len(out.decodes), overhead_ms)
        step += 1
    return recorded, decisions


def _draw(rng: random.Random, out, skill: dict, depth_per_request: bool) -> dict:
    """One step's inputs: each decode's accepted drafts (of all it could verify) and the timing
    parts in ms (verify, draft, prefill modules, overhead), with noise and slow stretches."""
    accepted = {}
    for d in out.decodes:
        n = 0
        while n < MAX_K and rng.random() < min(0.98, ACCEPTANCE[n] * skill[d.request.index]):
            n += 1
        accepted[str(d.request.index)] = n
    batch = max(1, len(out.decodes))
    k = out.num_speculative_tokens
    verified = max((d.num_draft_tokens for d in out.decodes), default=0)
    modules = max([k] + [min(MAX_K, d.request.draft_depth) for d in out.decodes]) if depth_per_request else k
    noise = rng.lognormvariate(0, 0.05) * (1.3 if rng.random() < 0.05 else 1.0)
    verify = (_cost(verified, batch) - _draft_ms(verified, batch)) * noise if out.decodes else 0.0
    draft = _draft_ms(modules, batch) * noise if out.decodes else 0.0
    prefill = (0.02 * sum(p.num_tokens * p.request.draft_depth for p in out.prefills)
               * rng.lognormvariate(0, 0.1))
    overhead = rng.uniform(0.3, 0.6) * (1 + batch / 16)
    return {"ms": [round(verify, 4), round(draft, 4), round(prefill, 4), round(overhead, 4)],
            "accepted": accepted}


if __name__ == "__main__":
    trace = {}
    for name in SCENARIOS:
        inputs, decisions = run(name)
        trace[name] = {"inputs": inputs, "decisions": decisions}
        ks = [d["k"] for d in decisions]
        print(name, len(decisions), "steps, k histogram", {k: ks.count(k) for k in sorted(set(ks))},
              "admitted", sorted({d for s in decisions for _, d in s["admitted"]}),
              "lowered", sum(len(s["lowered"]) for s in decisions), file=sys.stderr)
    with open(sys.argv[1], "w") as f:
        json.dump(trace, f, separators=(",", ":"))
