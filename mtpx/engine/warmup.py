"""The engine's dummy runs (vLLM's `_dummy_run` and `compile_or_warm_up_model`): warm_up drives an
Engine with short dummy requests so that every graph of the compiled step is built before anything
is timed (Engine.compile_stats reports what was built); with automatic k its depth buckets' decode
steps run through mtpx/auto_k/calibration.py (time_decode_steps) and its forced-k dummy steps under
calibration.forced. LLM runs it once its Engine is built: it drives the engine from above, as a
client does (the engine never calls it)."""
from __future__ import annotations

import sys

from mtpx.auto_k import calibration
from mtpx.core.request import Request
from mtpx.core.sampling_params import SamplingParams
from mtpx.engine.decode_step import depth_buckets

__all__ = ["warm_up"]


def warm_up(engine) -> dict | None:
    """With compile: run short dummy requests through `engine` (an Engine), two at once, three at
    once (two capture sizes: code after a graph break compiles again as dynamic on the second),
    then one alone (which must run in the graphs compiled at batch 2; a guard on B >= 2 would
    compile it again, tests/test_compiled.py),
    and with per-request depths (automatic k) one decode step at each depth bucket
    (decode_step.depth_buckets) and steps of k = 0 for requests that keep their depth
    (_steps_without_drafts), so the compiled functions exist before anything is timed; the prefix
    cache and the step timings are reset afterwards. Returns engine.compile_stats() (None without
    compile); automatic k then forgets what the dummy requests taught it
    (calibration.forget_dummies: not the step costs)."""
    if engine.compiled is None:
        return None
    c, k = engine.config, engine.num_speculative_tokens
    max_tokens = 2 * k + 3
    # a prompt that fits the model length and, with its output and drafts, the KV pool
    room = min(c.max_model_len - 1, c.num_blocks * c.block_size - 2 * k - 2) - max_tokens
    length = min(c.block_size + 1, room)
    if length >= 1:
        _dummy_batches(engine, SamplingParams(max_tokens=max_tokens, ignore_eos=True), length, 7)
        engine.kv.reset_prefix_cache()
        engine.reset_step_timings()
    if engine.scheduler.depth_per_request and length >= 1:
        # automatic k: every depth bucket's graphs now, not when a request first reaches it
        ks = depth_buckets(k, c.compile_depths)
        try:
            calibration.time_decode_steps(engine.runner, engine.kv, c, engine.model.cfg.vocab_size,
                                          min(2, c.max_num_seqs), ks, length, rounds=0, warmup=1)
        except ValueError as err:
            print(f"engine.compile: warm-up of the depths {ks} skipped ({err}): they compile when "
                  "first used", file=sys.stderr)
        _steps_without_drafts(engine, k, length)
    if engine.runner.choice is not None and length >= 1:
        _tree_steps(engine, k, length)
    # automatic k learned the dummy requests' acceptance (a repeated pattern, accepted far more
    # than real text): the first real requests would be decided on it
    calibration.forget_dummies(engine.draft_length)
    stats = engine.compile_stats()
    if stats["num_graphs"]:
        print(f"engine.compile: {stats['num_graphs']} graphs in {stats['compile_s']:.1f} s "
              f"({stats['num_compiled']} compiled, {stats['num_loaded']} loaded from {stats['cache_dir']})",
              file=sys.stderr, flush=True)
    if engine.compiled.num_calls == 0:
        print(f"engine.compile: warm-up could not decode (engine.num_blocks={c.num_blocks} or "
              f"max_model_len={c.max_model_len} is too small for a short request with {k} "
              "drafts): the first decode step will compile", file=sys.stderr)
    return engine.compile_stats()


def _steps_without_drafts(engine, k: int, length: int) -> None:
    """Automatic k: two dummy requests of depth k decode steps of k = 0 and k - 1 between steps
    of k, so the draft rounds those need have run before anything is timed: the modules' catch-up
    after a 1-token window (padded to k + 1 columns) and, when a step drafts more than the one
    before, a round without drafts first (StepShapes.catch_up). Both run in the k + 1 columns'
    draft graph (experiments/auto_k/compiled_c1). Every step's k and depth is forced
    (calibration.forced); the prefix cache and step timings are reset afterwards."""
    schedule = iter([0, k, 0, 0, k, max(k - 1, 0), k, k])
    try:
        with calibration.forced(engine.draft_length, k) as force:
            params = SamplingParams(max_tokens=8 * (k + 1), ignore_eos=True)
            vocab = engine.model.cfg.vocab_size
            for i in range(2):
                engine.add_request(Request(i, [(5 * i + j) % vocab for j in range(length)], params))
            while engine.has_unfinished_requests():
                engine.step()
                force(next(schedule, k))
    finally:
        engine.kv.reset_prefix_cache()
        engine.reset_step_timings()


def _tree_steps(engine, k: int, length: int) -> None:
    """The automatic choice between chain and tree (mtpx/engine/tree_choice.py): dummy requests two,
    three and one at once whose steps alternate chain (k drafts) and tree on a forced schedule, so
    the tree's graphs (its verification, its draft round: mtpx/engine/compiled_tree.py) are built
    at batch 2 first and have run at every batch and switch before anything is timed. The policy's
    own choice comes back afterwards; the prefix cache and step timings are reset."""
    policy = engine.draft_length
    schedule = lambda step: step % 4 in (1, 2)     # noqa: E731 - chain -> tree -> tree -> chain -> chain
    try:
        with calibration.forced(policy, k), calibration.forced_forms(policy, schedule):
            _dummy_batches(engine, SamplingParams(max_tokens=4 * (k + 1), ignore_eos=True), length, 3)
    finally:
        engine.kv.reset_prefix_cache()
        engine.reset_step_timings()


def _dummy_batches(engine, params: SamplingParams, length: int, stride: int) -> None:
    """Dummy requests of `length` prompt tokens (request i: token (stride * i + j) mod vocab at j), two,
    three, then one at once (warm_up says why), each batch decoded to the end."""
    vocab = engine.model.cfg.vocab_size
    for batch in (2, 3, 1):
        for i in range(batch):
            engine.add_request(Request(i, [(stride * i + j) % vocab for j in range(length)], params))
        while engine.has_unfinished_requests():
            engine.step()
