"""Automatic k's start-up measurement, through the model runner's public calls (no torch, no
engine): `calibrate` is the one entry point (a saved step-cost file when it matches, else the
decode step's cost per k and batch size, `calibrate_step_costs` over `time_decode_steps`, which
drives ModelRunner.decode; and a prefill's speculator part, `calibrate_prefill_cost`, which
drives ModelRunner.execute). `forced` holds every step's k and depth for warm-up's dummy steps.
docs/automatic_k.md gives the measurements behind the passes and the spread."""
from __future__ import annotations

import copy
import math
import random
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

from mtpx.auto_k.policy import AutoDraftLength
from mtpx.auto_k.tree_choice import AutoChainOrTree
from mtpx.auto_k.store import DRAFT_KEY, PREFILL_KEY, check_step_cost_meta, load_step_costs, save_step_costs
from mtpx.core.request import Request
from mtpx.core.sampling_params import SamplingParams
from mtpx.core.scheduler import ScheduledDecode, ScheduledPrefill, SchedulerOutput
from mtpx.core.step_plan import num_new_drafts

__all__ = ["calibrate", "calibrate_step_costs", "calibrate_prefill_cost", "time_decode_steps",
           "default_batch_sizes", "forced", "forget_dummies"]


def default_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 4, 16, 64, ... below max_num_seqs, and max_num_seqs."""
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 4
    return sizes + [max_num_seqs]


def calibrate(scheduler, runner, config, vocab_size: int, buckets: dict[int, int] | None = None,
              path: str | Path | None = None, meta: dict | None = None, cached: bool = False,
              progress=None) -> dict:
    """Give the scheduler's automatic k its step costs, draft rounds and module prefill cost: from
    `path` when it exists and matches `meta` (store.check_step_cost_meta; a file without the
    prefill cost has it measured now), else measured now on `runner` (a ModelRunner) and the
    scheduler's KV cache manager, and written to `path` (None: not written). config: the engine's
    EngineConfig; buckets: {k: the k whose step a compiled engine runs for it} (None: each its
    own); cached: `path` is the step-cost cache, so a damaged or mismatched file is measured
    again. progress(line): called with a line when measuring starts, after a pass at most every
    10 s (calibrate_step_costs), and when a damaged cache file is measured again (None: silent).
    Interrupted (KeyboardInterrupt) after calibrate_step_costs' minimum passes, the costs so far
    are saved to `path` (the prefill cost is measured by the next run) and the interrupt goes on.
    Returns {"source", "seconds", and the file's or `meta`'s keys}. Raises ValueError without
    automatic k, with requests in the engine, or for a given file that is not a step-cost file
    or was measured on another engine."""
    policy, meta = scheduler.draft_length, dict(meta or {})
    if not isinstance(policy, AutoDraftLength):
        raise ValueError("calibration needs num_speculative_tokens=auto")
    if scheduler.has_work():
        raise ValueError("calibrate the step costs before adding requests")
    kv = scheduler.kv

    def prefill() -> float | None:
        return calibrate_prefill_cost(runner, kv, config, vocab_size, policy.max_k)

    t0 = time.perf_counter()
    if path is not None and Path(path).exists():
        try:
            costs, file_meta = load_step_costs(path)
            check_step_cost_meta(path, file_meta, meta)
        except ValueError as e:
            if not cached:
                raise
            if progress is not None:
                progress(f"automatic k: the step-cost cache {path} is damaged or stale "
                         f"({str(e).split(': ', 1)[-1]}); calibrating again")
        else:                                  # a damaged cache file is measured again below
            policy.set_step_costs(costs)
            if file_meta.get(DRAFT_KEY):         # a file written without them: t(k) - t(0) (draft_cost)
                policy.costs.set_draft_costs({(int(r["k"]), int(r["batch_size"])): float(r["draft_ms"])
                                        for r in file_meta[DRAFT_KEY]})
            if file_meta.get(PREFILL_KEY) is None:   # a file written without it: measured now
                file_meta[PREFILL_KEY] = prefill()
            if file_meta[PREFILL_KEY] is not None:
                policy.costs.set_prefill_cost(float(file_meta[PREFILL_KEY]))
            return {**file_meta, "source": f"loaded from {path}",
                    "seconds": round(time.perf_counter() - t0, 2)}
    draft: dict = {}

    def measure(b, ks, context_len, rounds, seed=0, draft=None):
        return time_decode_steps(runner, kv, config, vocab_size, b, ks, context_len, rounds, seed=seed,
                                 depth_per_request=scheduler.depth_per_request, draft=draft)
    if progress is not None:
        progress(f"automatic k: calibrating the step costs of k = 0..{policy.max_k} at batch sizes "
                 f"{default_batch_sizes(config.max_num_seqs)} (once; then "
                 f"{'kept in ' + str(path) if path is not None else 'not saved'})")
    try:
        costs = calibrate_step_costs(measure, policy.max_k, config.max_num_seqs, buckets, draft_costs=draft,
                                     on_pass=None if progress is None else _pass_lines(progress))
    except CalibrationInterrupted as stop:       # enough passes: keep them, then stop as asked
        if path is not None:
            save_step_costs(path, stop.costs, {**meta, PREFILL_KEY: None, DRAFT_KEY: _draft_rows(draft)})
        raise KeyboardInterrupt from None
    policy.set_step_costs(costs)
    policy.costs.set_draft_costs(draft)
    prefill_ms = prefill()
    if prefill_ms is not None:
        policy.costs.set_prefill_cost(prefill_ms)
    meta = {**meta, PREFILL_KEY: prefill_ms, DRAFT_KEY: _draft_rows(draft)}
    if path is not None:
        save_step_costs(path, costs, meta)
    return {"source": "calibrated" if path is None else f"calibrated, saved to {path}",
            "seconds": round(time.perf_counter() - t0, 2), **meta}


def _draft_rows(draft: dict) -> list[dict]:
    return [{"k": k, "batch_size": b, "draft_ms": ms} for (k, b), ms in sorted(draft.items())]


def _pass_lines(progress, every_s: float = 10.0):
    """on_pass for calibrate_step_costs: a progress line at most every `every_s` seconds."""
    t0 = last = time.perf_counter()

    def on_pass(done: int, spent_s: float, passes: int, spread_s: float) -> None:
        nonlocal last
        if time.perf_counter() - last >= every_s:
            last = time.perf_counter()
            progress(f"automatic k: calibration pass {done} done, {spent_s:.1f} s of steps timed "
                     f"(until {passes} passes and {spread_s:.0f} s), {last - t0:.0f} s elapsed")
    return on_pass


class CalibrationInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM after calibrate_step_costs' minimum passes: `costs` from those passes."""

    def __init__(self, costs: dict):
        super().__init__()
        self.costs = costs


def calibrate_step_costs(measure, max_k: int, max_num_seqs: int, buckets: dict[int, int] | None = None,
                         batch_sizes=None, rounds: int = 8, context_len: int = 192, seed: int = 0,
                         draft_costs: dict | None = None, passes: int = 3, spread_s: float = 10.0,
                         max_passes: int = 24, on_pass=None) -> dict:
    """The decode step's ms at every k in 0..max_k and batch size B (default_batch_sizes of
    max_num_seqs unless batch_sizes): measure(B, ks, context_len, rounds, seed=, draft=) times B
    requests at context_len known tokens verifying and proposing each k of ks, alternated call by
    call over `rounds` rounds (`time_decode_steps`), returning {k: [ms per round]} and filling
    draft with the draft rounds'. A pass's cost of a k is the median of its rounds, a k's cost the
    least of `passes` passes, each over every batch size in turn; passes go on (at most
    max_passes) until the steps they timed add up to spread_s seconds: load from another process
    only slows a step, in stretches that can cover a whole pass. buckets: {k: the k whose step a
    compiled engine runs for it} (its depth bucket; None: each its own): only those are timed.
    Returns {(k, B): ms}; draft_costs (when given) gets the same steps' draft rounds.
    on_pass(done, spent_s, passes, spread_s) after each pass. A KeyboardInterrupt after `passes`
    whole passes raises CalibrationInterrupted with their costs (before: as it is)."""
    sizes = default_batch_sizes(max_num_seqs) if batch_sizes is None else sorted(set(batch_sizes))
    bucket = {k: k for k in range(max_k + 1)} if buckets is None else dict(buckets)
    tops = sorted(set(bucket.values()))
    step: dict = {}
    draft_step: dict = {}
    done = spent_ms = 0

    def result() -> dict:
        if draft_costs is not None:
            draft_costs.update({(k, b): draft_step[(top, b)] for b in sizes for k, top in bucket.items()})
        return {(k, b): step[(top, b)] for b in sizes for k, top in bucket.items()}
    while done < max(1, passes) or spent_ms < 1e3 * spread_s and done < max_passes:
        pass_step, pass_draft = dict(step), dict(draft_step)
        try:
            for b in sizes:
                draft: dict = {}
                times = measure(b, tops, context_len, rounds, seed=seed, draft=draft)
                spent_ms += sum(sum(ts) for ts in times.values())
                for top in tops:
                    pass_step[(top, b)] = min(step.get((top, b), math.inf), statistics.median(times[top]))
                    pass_draft[(top, b)] = min(draft_step.get((top, b), math.inf),
                                               statistics.median(draft[top]))
        except KeyboardInterrupt:
            if done >= max(1, passes):
                raise CalibrationInterrupted(result()) from None
            raise
        step, draft_step, done = pass_step, pass_draft, done + 1
        if on_pass is not None:
            on_pass(done, spent_ms / 1e3, passes, spread_s)
    return result()


def time_decode_steps(runner, kv, config, vocab_size: int, batch_size: int, ks: list[int], context_len: int,
                      rounds: int, warmup: int = 1, seed: int = 0, depth_per_request: bool = True,
                      draft: dict | None = None) -> dict[int, list[float]]:
    """Milliseconds of the decode step of batch_size requests at context_len known tokens (random
    ids in [2, vocab_size)), each verifying and proposing k drafts, for each k of ks, alternated
    call by call (in an order rotated and reversed every round) over `rounds` rounds after
    `warmup` untimed ones: ModelRunner.decode on `runner`, no prefill (the positions before the
    window are taken as computed). Each request has depth k (depth_per_request: the step of a
    k-module engine), else the runner's num_speculative_tokens. context_len is lowered to what
    config's max_model_len and KV pool allow; the requests' blocks (from `kv`) and batch slots are
    freed afterwards. Returns {k: [ms per round]}; draft (when given) gets {k: [ms of the step's
    draft round per round]}. Raises ValueError when the pool or the batch cannot hold them."""
    c, top = config, max(ks)
    per_request = c.num_blocks // batch_size * c.block_size - 2 * top - 2
    context_len = min(context_len, c.max_model_len - 1, per_request)
    if context_len < 1 or batch_size > c.max_num_seqs:
        raise ValueError(f"calibration at batch {batch_size}: the engine holds at most {c.max_num_seqs} "
                         f"requests and {c.num_blocks} KV blocks (engine.max_num_seqs, engine.num_blocks)")
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    reqs = [Request(-1 - i, [rng.randrange(2, vocab_size) for _ in range(context_len)], params)
            for i in range(batch_size)]
    times: dict[int, list[float]] = {k: [] for k in ks}
    rounds_draft: dict[int, list[float]] = {k: [] for k in ks}
    try:
        for r in reqs:
            if not kv.allocate_slots(r.index, context_len + 2 * top + 2):
                raise ValueError(f"calibration at batch {batch_size}: the KV pool of {c.num_blocks} blocks "
                                 "cannot hold it (engine.num_blocks)")
        tables = [kv.block_table(r.index) for r in reqs]
        for i in range(warmup + rounds):
            order = list(ks[i % len(ks):]) + list(ks[: i % len(ks)])
            for k in (order if i % 2 == 0 else order[::-1]):
                depth = k if depth_per_request else runner.num_speculative_tokens
                decodes = []
                for r, table in zip(reqs, tables):
                    copied = copy.copy(r)             # the request's own fields stay as they are
                    copied.draft_token_ids, copied.draft_depth = [1] * k, depth
                    decodes.append(ScheduledDecode(copied, k, table, num_new_drafts=num_new_drafts(k, depth)))
                step_s, draft_s = runner.decode(decodes)
                if i >= warmup:
                    times[k].append(1e3 * step_s)
                    rounds_draft[k].append(1e3 * draft_s)
    finally:
        for r in reqs:
            runner.release(r.index)
            kv.free(r.index)
    if draft is not None:
        draft.update(rounds_draft)
    return times


def calibrate_prefill_cost(runner, kv, config, vocab_size: int, k: int, prompt_len: int = 128,
                           rounds: int = 3, seed: int = 0) -> float | None:
    """The speculator's part of a prefill (StepTiming.prefill_draft_s: its draft modules over the
    prompt, then the first drafts) in ms per prompt token and module: `rounds` requests of
    prompt_len random tokens (lowered to what config's max_model_len and KV pool allow), each
    prefilled alone at depth k through ModelRunner.execute (chunks of at most
    max_num_batched_tokens, ending on block boundaries), the median of their chunks' values. The
    engine's own prefill path, eager as in every run, at the main job's prompt length (a prompt of
    a few tokens reads dearer per token). Returns None without step timings or room for a prompt."""
    c = config
    length = min(prompt_len, c.max_model_len - 2, c.num_blocks * c.block_size - 2 * k - 3)
    if length < 1 or not c.record_step_timings:
        return None
    rng = random.Random(seed)
    values = []
    for i in range(rounds):
        r = Request(-1 - i, [rng.randrange(2, vocab_size) for _ in range(length)],
                    SamplingParams(max_tokens=1, ignore_eos=True))
        r.draft_depth = k
        try:
            start = 0
            while start < length:
                n = min(length - start, c.max_num_batched_tokens)
                if start + n < length:
                    n -= n % c.block_size              # non-final chunks end on a block boundary
                if n <= 0 or not kv.allocate_slots(r.index, min(start + n + k, length + 2 * k + 2)):
                    break
                last = start + n == length
                item = ScheduledPrefill(r, start, n, last, new=start == 0,
                                        block_table=kv.block_table(r.index),
                                        num_new_drafts=num_new_drafts(k, k) if last else 0)
                t = runner.execute(SchedulerOutput(prefills=[item], num_speculative_tokens=k)).timing
                if t is not None and t.num_prefill_module_tokens:
                    values.append(1e3 * t.prefill_draft_s / t.num_prefill_module_tokens)
                r.num_computed_tokens = start = start + n
        finally:
            runner.release(r.index)
            kv.free(r.index)
    return statistics.median(values) if values else None


@contextmanager
def forced(policy, k: int):
    """Inside, every step's k and every admitted depth of automatic k is k (warm-up's dummy
    steps; yields set(k), which forces another k from the next step on); afterwards the policy's
    own values come back. A fixed k is left alone."""
    if not isinstance(policy, AutoDraftLength):
        yield lambda k: None
        return
    saved = policy.forced, policy.forced_depth
    policy.forced, policy.forced_depth = k, k

    def force(k: int) -> None:
        policy.forced = k
    try:
        yield force
    finally:
        policy.forced, policy.forced_depth = saved


@contextmanager
def forced_forms(policy, schedule):
    """Inside, schedule(step) -> bool (True: the tree) decides every step's form of the automatic
    choice between chain and tree (mtpx/auto_k/tree_choice.py; warm-up's dummy steps); afterwards
    the policy's own choice comes back. Other policies are left alone."""
    if not isinstance(policy, AutoChainOrTree):
        yield
        return
    saved = policy.forced_tree
    policy.forced_tree = schedule
    try:
        yield
    finally:
        policy.forced_tree = saved


def forget_dummies(policy) -> None:
    """Automatic k forgets what dummy requests taught it (AutoDraftLength.reset: not the step
    costs); a fixed k has nothing to forget."""
    if isinstance(policy, AutoDraftLength):
        policy.reset()
