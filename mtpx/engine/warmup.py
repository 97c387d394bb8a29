"""The engine's dummy runs (vLLM's `_dummy_run` and `compile_or_warm_up_model`): warm_up drives an
Engine with short dummy requests so that every graph of the compiled step is built before anything
is timed (compile_stats reports what was built), and time_decode_steps times the decode step of
dummy requests without prefill (automatic k's calibration). Engine.warmup, Engine.compile_stats and
Engine.time_decode_steps call these."""
from __future__ import annotations

import sys
from contextlib import contextmanager

import torch

from mtpx.core.request import Request
from mtpx.core.sampling_params import SamplingParams
from mtpx.engine.decode_step import depth_buckets

__all__ = ["warm_up", "compile_stats", "time_decode_steps", "forced_dummy_requests"]


def warm_up(engine) -> dict | None:
    """With compile: run short dummy requests through `engine` (an Engine), two at once, three at
    once (two capture sizes: code after a graph break compiles again as dynamic on the second),
    then one alone (which must run in the graphs compiled at batch 2; a guard on B >= 2 would
    compile it again, tests/test_compiled.py),
    and with per-request depths (automatic k) one decode step at each depth bucket
    (decode_step.depth_buckets) and steps of k = 0 for requests that keep their depth
    (_steps_without_drafts), so the compiled functions exist before anything is timed; the prefix
    cache and the step timings are reset afterwards. Returns compile_stats(engine) (None without
    compile); automatic k then forgets what the dummy requests taught it (AutoDraftLength.reset:
    not the step costs)."""
    if engine.compiled is None:
        return None
    c, k = engine.config, engine.num_speculative_tokens
    max_tokens = 2 * k + 3
    # a prompt that fits the model length and, with its output and drafts, the KV pool
    room = min(c.max_model_len - 1, c.num_blocks * c.block_size - 2 * k - 2) - max_tokens
    length = min(c.block_size + 1, room)
    if length >= 1:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        vocab = engine.model.cfg.vocab_size
        for batch in (2, 3, 1):
            for i in range(batch):
                engine.add_request(Request(i, [(7 * i + j) % vocab for j in range(length)], params))
            while engine.has_unfinished_requests():
                engine.step()
        engine.kv.reset_prefix_cache()
        engine.reset_step_timings()
    if engine.scheduler.depth_per_request and length >= 1:
        # automatic k: every depth bucket's graphs now, not when a request first reaches it
        ks = depth_buckets(k, c.compile_depths)
        try:
            engine.time_decode_steps(min(2, c.max_num_seqs), ks, length, rounds=0, warmup=1)
        except ValueError as err:
            print(f"engine.compile: warm-up of the depths {ks} skipped ({err}): they compile when "
                  "first used", file=sys.stderr)
        _steps_without_drafts(engine, k, length)
    if getattr(engine.draft_length, "auto", False):
        # automatic k learned the dummy requests' acceptance (a repeated pattern, accepted far
        # more than real text): the first real requests would be decided on it
        engine.draft_length.reset()
    stats = compile_stats(engine)
    if stats["num_graphs"]:
        print(f"engine.compile: {stats['num_graphs']} graphs in {stats['compile_s']:.1f} s "
              f"({stats['num_compiled']} compiled, {stats['num_loaded']} loaded from {stats['cache_dir']})",
              file=sys.stderr, flush=True)
    if engine.compiled.num_calls == 0:
        print(f"engine.compile: warm-up could not decode (engine.num_blocks={c.num_blocks} or "
              f"max_model_len={c.max_model_len} is too small for a short request with {k} "
              "drafts): the first decode step will compile", file=sys.stderr)
    return compile_stats(engine)


def _steps_without_drafts(engine, k: int, length: int) -> None:
    """Automatic k: two dummy requests of depth k decode steps of k = 0 and k - 1 between steps
    of k, so the draft rounds those need have run before anything is timed: the modules' catch-up
    after a 1-token window (padded to k + 1 columns) and, when a step drafts more than the one
    before, a round without drafts first (StepShapes.catch_up). Both run in the k + 1 columns'
    draft graph; they once were graphs of their own (1 and 2k columns), compiled in the first timed
    requests (experiments/auto_k/compiled_c1)."""
    if not hasattr(engine.draft_length, "forced_depth"):
        return
    schedule = iter([0, k, 0, 0, k, max(k - 1, 0), k, k])
    with forced_dummy_requests(engine, k) as policy:
        params = SamplingParams(max_tokens=8 * (k + 1), ignore_eos=True)
        vocab = engine.model.cfg.vocab_size
        for i in range(2):
            engine.add_request(Request(i, [(5 * i + j) % vocab for j in range(length)], params))
        while engine.has_unfinished_requests():
            engine.step()
            policy.forced = next(schedule, k)


@contextmanager
def forced_dummy_requests(engine, k: int):
    """Run dummy requests inside with every step's k and every admitted depth forced to k
    (automatic k's `forced`, `forced_depth`; yields the policy); afterwards the policy's own
    values come back and the prefix cache and step timings are reset, so nothing the dummies left
    is reused or counted."""
    policy = engine.draft_length
    saved = policy.forced, policy.forced_depth
    policy.forced, policy.forced_depth = k, k
    try:
        yield policy
    finally:
        policy.forced, policy.forced_depth = saved
        engine.kv.reset_prefix_cache()
        engine.reset_step_timings()


def compile_stats(engine) -> dict | None:
    """{"compile_s": seconds spent in calls that built a graph, "num_graphs": graphs built
    (compiled or loaded from the cache), "num_compiled", "num_loaded", "graphs": [{"graph",
    "seconds", "source"}], "regions": compiled layer regions on, "cache_dir",
    "capture_sizes": padded batch sizes (None: unpadded, the CPU), "mode", "backend"}, or None without compile."""
    c = engine.compiled
    if c is None:
        return None
    return {**c.progress.summary(), "regions": engine.cache.compile_regions, "cache_dir": c.cache_dir,
            "capture_sizes": c.sizes, "mode": c.mode or "default", "backend": c.backend}


def time_decode_steps(engine, batch_size: int, ks: list[int], context_len: int, rounds: int,
                      warmup: int = 1, seed: int = 0, draft: dict | None = None) -> dict[int, list[float]]:
    """Milliseconds of `engine`'s decode step of batch_size requests at context_len known tokens,
    verifying and proposing k drafts, for each k of ks, alternated call by call over `rounds`
    rounds after `warmup` untimed ones (ModelRunner.time_decode_steps: no prefill, the prompt
    positions are taken as computed). With per-request depth (multi-module MTP and automatic
    k) every request has depth k: the step of a k-module engine. context_len is lowered to
    what the model length and the KV pool allow. Returns {k: [ms per round]}; draft (when given)
    gets {k: [ms of the step's draft round per round]}. Raises
    ValueError when the engine has requests or the pool cannot hold the batch."""
    if engine.has_unfinished_requests():
        raise ValueError("time the decode steps (calibrate the step costs) before adding requests")
    c, top, kv = engine.config, max(ks), engine.kv
    per_request = c.num_blocks // batch_size * c.block_size - 2 * top - 2
    context_len = min(context_len, c.max_model_len - 1, per_request)
    if context_len < 1 or batch_size > c.max_num_seqs:
        raise ValueError(f"calibration at batch {batch_size}: the engine holds at most {c.max_num_seqs} "
                         f"requests and {c.num_blocks} KV blocks (engine.max_num_seqs, engine.num_blocks)")
    g = torch.Generator().manual_seed(seed)
    vocab = engine.model.cfg.vocab_size
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    reqs = [Request(-1 - i, torch.randint(2, vocab, (context_len,), generator=g).tolist(), params)
            for i in range(batch_size)]
    try:
        for r in reqs:
            if not kv.allocate_slots(r.index, context_len + 2 * top + 2):
                raise ValueError(f"calibration at batch {batch_size}: the KV pool of {c.num_blocks} blocks "
                                 "cannot hold it (engine.num_blocks)")
        draft_s: dict = {}
        seconds = engine.runner.time_decode_steps(
            reqs, [kv.block_table(r.index) for r in reqs], list(ks), rounds, warmup,
            engine.scheduler.depth_per_request, draft_s)
    finally:
        for r in reqs:
            kv.free(r.index)
    if draft is not None:
        draft.update({k: [1e3 * s for s in v] for k, v in draft_s.items()})
    return {k: [1e3 * s for s in v] for k, v in seconds.items()}
