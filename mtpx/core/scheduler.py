"""Continuous-batching scheduler (vLLM v1's design, simplified), the one writer of request progress.

`schedule()` hands out one step's work; `update_from_output(out, result)` applies the model
runner's RunnerOutput: appends the verified tokens (cut at a stop token, max_tokens or
max_model_len), counts the round, advances num_computed_tokens, publishes the blocks whose KV is
final and frees those of requests that ended. Every step it hands out a token
budget, first to running requests (verification windows of 1 + num_draft_tokens, then the next
chunk of prompts still being prefilled), then to waiting requests in arrival order. Prefill chunks
end on block boundaries (except a prompt's last chunk) so that the Gated DeltaNet state at every
block boundary can be stored with the block for prefix caching.

When the KV cache manager cannot supply the blocks a running request needs, the most recently
admitted running request is preempted: its blocks and batch slot are released and it goes back to
the front of the waiting queue to be recomputed later (prefill over prompt + output so far), so
every request still finishes.
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field

from mtpx.core.kv_cache_manager import KVCacheManager
from mtpx.core.request import Request
from mtpx.core.step_plan import Candidate, Round, StepRecord, StepView


@dataclass
class ScheduledPrefill:
    """Positions [start, start + num_tokens) of `request` run through the target this step;
    is_last: the chunk reaches the last known token, so the target samples the next one and the
    speculator drafts; new: the request was admitted this step (it needs a batch slot, its tokens
    in the token buffer, and its recurrent state from the prefix hit at `start`); block_table:
    the request's block ids (the KV cache manager's live list); num_new_drafts: the drafts the
    request proposes after this chunk (0 unless is_last; `schedule` sets it from the step's k and
    the request's depth: the one place that rule is applied)."""

    request: Request
    start: int
    num_tokens: int
    is_last: bool
    new: bool = False
    block_table: list[int] = field(default_factory=list)
    num_new_drafts: int = 0


@dataclass
class ScheduledDecode:
    """A verification window [x_n, d_1 .. d_num_draft_tokens] for `request`; block_table as
    ScheduledPrefill's; num_new_drafts: the drafts it proposes after this step (set by `schedule`,
    as ScheduledPrefill's)."""

    request: Request
    num_draft_tokens: int
    block_table: list[int] = field(default_factory=list)
    num_new_drafts: int = 0


@dataclass
class SchedulerOutput:
    """num_speculative_tokens: drafts every request proposes for the next step (the k of this
    step, mtpx/auto_k/policy.py; decodes verify the drafts the step before proposed)."""

    prefills: list[ScheduledPrefill] = field(default_factory=list)
    decodes: list[ScheduledDecode] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    allocation: object | None = None      # the decodes' per-request ks (AutoDraftLength.allocate)
    num_speculative_tokens: int = 0
    tree: bool = False                    # every request proposes a leaf tree (mtpx/auto_k/tree_choice.py)

    @property
    def num_scheduled_tokens(self) -> int:
        return (sum(p.num_tokens for p in self.prefills)
                + sum(1 + d.num_draft_tokens for d in self.decodes))


class Scheduler:
    """kv: the block manager; max_num_seqs: running requests at most (batch slots);
    max_num_batched_tokens: target tokens per step; draft_length: FixedDraftLength or
    AutoDraftLength (mtpx/auto_k/policy.py), which picks each step's k and learns from its
    rounds; the scheduler reserves slots for its max_k positions beyond a step's last token, which
    the speculator writes; max_len: positions a request's block table can cover;
    max_model_len: positions a request may reach (prompt + output); num_lookahead_tokens: the
    speculator's (0 without one); depth_per_request: give each request the policy's depth at its
    admission (multi-module MTP), else every request has depth max_k.

    Requests are added with add(); schedule() returns one step's work (the runner frees the batch
    slots of out.preempted and assigns slots to new prefills); update_from_output() applies its
    result; abort() ends a request between steps.
    """

    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 draft_length, max_len: int, max_model_len: int, num_lookahead_tokens: int = 0,
                 depth_per_request: bool = False):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.draft_length = draft_length
        self.lookahead = draft_length.max_k
        self.num_lookahead_tokens = num_lookahead_tokens
        self.depth_per_request = depth_per_request
        self.max_len = max_len
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._ids: set = set()                    # indices of the requests waiting or running
        self._removed: list = []                  # indices that left since the last step (StepView.removed)
        self._budget = 0                          # the step's token budget left for admissions (`_admit`)
        self._step_start = 0.0                    # clock() when the step's schedule() began
        self.clock = time.perf_counter            # the step's wall time (StepRecord.wall_s)

    def add(self, request: Request) -> None:
        """Queue a request. Raises ValueError when its index is already waiting or running (ids
        key the KV block tables and batch slots, so they must be unique while in the engine)."""
        if request.index in self._ids:
            raise ValueError(f"request id {request.index!r} is already in the engine: give every "
                             "request in flight a unique id")
        self._ids.add(request.index)
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _slots(self, request: Request, end: int) -> int:
        return min(self.max_len, end + self.lookahead)

    def draft_budget(self, r: Request) -> int:
        """Drafts to verify: every draft proposed, but never more than the request can still use
        (docs/architecture.md, invariant 7). (A step's k is how many it proposes; the next step verifies
        them all, so a probe of one more draft is verified too.)"""
        room = min(r.params.max_tokens - len(r.output_token_ids), self.max_model_len - r.num_tokens)
        return max(0, min(len(r.draft_token_ids), room - 1))

    def schedule(self) -> SchedulerOutput:
        self._step_start = self.clock()
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        S = self.kv.block_size
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            if r.is_prefilling:
                remaining = r.num_tokens - r.num_computed_tokens
                n = min(remaining, budget)
                if n < remaining:
                    n -= n % S                      # non-final chunks end on a block boundary
                if n == 0:
                    i += 1
                    continue
                need = r.num_computed_tokens + n
            else:
                n = 1 + min(self.draft_budget(r), budget - 1)
                need = r.num_tokens - 1 + n
            while not self.kv.allocate_slots(r.index, self._slots(r, need)):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is r:
                    break
            if r not in self.running:               # r itself was preempted
                break
            table = self.kv.block_table(r.index)
            if r.is_prefilling:
                out.prefills.append(ScheduledPrefill(r, r.num_computed_tokens, n,
                                                     r.num_computed_tokens + n == r.num_tokens,
                                                     block_table=table))
            else:
                out.decodes.append(ScheduledDecode(r, n - 1, table))
            budget -= n
            i += 1
        self._budget = budget
        plan = self.draft_length.plan(StepView(
            self._expected_batch(), self.depth_per_request, tuple(r.draft_depth for r in self.running),
            tuple((d.request.index, d.num_draft_tokens) for d in out.decodes),
            () if out.preempted else self._candidates(), lambda depth, freed: self._admit(out, depth, freed),
            tuple(self._removed)))
        self._removed = []
        if plan.num_verified is not None:     # a per-request allocation: each decode verifies its own
            out.allocation = plan.allocation
            for d, n in zip(out.decodes, plan.num_verified):
                d.num_draft_tokens = n
        lowered = dict(plan.lowered)
        for r in self.running:
            r.draft_depth = lowered.get(r.draft_depth, r.draft_depth)
        out.num_speculative_tokens = plan.k
        out.tree = plan.tree
        for item in out.prefills + out.decodes:     # a request drafts at most its depth
            if not isinstance(item, ScheduledPrefill) or item.is_last:
                item.num_new_drafts = plan.num_new_drafts(item.request.draft_depth)
        return out

    def _expected_batch(self) -> int:
        return min(self.max_num_seqs, len(self.running) + len(self.waiting))

    def _candidates(self) -> tuple[Candidate, ...]:
        """The waiting requests the step could admit (as many as free batch slots), in order."""
        free = max(0, self.max_num_seqs - len(self.running))
        return tuple(Candidate(not r.admitted_once, r.draft_depth, r.num_tokens, r.params.max_tokens)
                     for r in list(self.waiting)[:free])

    def _lookahead(self, r: Request) -> int:
        """The tokens after a block that r's prefix-cache keys cover (KVCacheManager): its depth's."""
        return min(r.draft_depth, self.num_lookahead_tokens)

    def _admit(self, out: SchedulerOutput, depth: int, freed: int) -> bool:
        """Admit the first waiting request at draft depth `depth` (StepView.admit; set before its
        prefix-cache lookup, which keys blocks on the depth's lookahead), with `freed` more tokens of
        budget than the running requests left. Returns False, admitting nothing, when no request
        waits, the batch or the budget is full, or its blocks do not fit."""
        budget = self._budget + freed
        if not self.waiting or budget <= 0 or len(self.running) >= self.max_num_seqs:
            return False
        S = self.kv.block_size
        r = self.waiting[0]
        tokens = r.all_token_ids
        r.draft_depth = depth
        hit_blocks, hit = self.kv.get_computed_blocks(r.index, tokens, self._lookahead(r))
        if r.params.prompt_logprobs is not None and hit:   # prompt scoring computes every position
            hit_blocks, hit = [], 0
        remaining = len(tokens) - hit
        n = min(remaining, budget)
        if n < remaining:
            n -= n % S
        if n == 0 or not self.kv.allocate_slots(r.index, self._slots(r, hit + n), hit_blocks):
            return False
        self.waiting.popleft()
        r.num_computed_tokens = hit
        if not r.admitted_once:
            r.num_cached_tokens = hit
            r.admitted_once = True
        self.running.append(r)
        out.prefills.append(ScheduledPrefill(r, hit, n, hit + n == len(tokens), new=True,
                                             block_table=self.kv.block_table(r.index)))
        self._budget -= n
        return True

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        self.kv.free(r.index)
        r.num_computed_tokens = 0
        r.draft_token_ids = []
        r.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(r)

    # ---- results ------------------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, result) -> list[Request]:
        """Apply a RunnerOutput (mtpx/engine/model_runner.py) to the step's requests; returns
        those that finished, their blocks already published (what is final) and freed."""
        finished = []
        now = time.perf_counter()
        rounds = []
        for d in out.decodes:     # before the results apply: what the step verified, at which age
            r, res = d.request, result.results[d.request.index]
            rounds.append(Round(r.index, d.num_draft_tokens, len(r.draft_token_ids), r.draft_depth,
                                len(r.output_token_ids), res.num_draft_tokens, res.num_accepted,
                                len(res.token_ids), res.leaf_rank))
        for item in out.prefills + out.decodes:
            r = item.request
            res = result.results[r.index]
            if isinstance(item, ScheduledPrefill):
                r.num_computed_tokens = item.start + item.num_tokens
            for position, entry in res.prompt_logprobs or []:
                r.prompt_logprobs.setdefault(position, entry)   # a recomputed prompt keeps its first
            if res.token_ids:
                self._append(r, res, now)
            if not r.finished:
                r.draft_token_ids = res.draft_token_ids
                if isinstance(item, ScheduledDecode):   # the newest token has no KV yet
                    r.num_computed_tokens = r.num_tokens - 1
            # publish what is final; a finished request's tokens are a prefix of what the runner
            # computed with, and the manager keys and bounds blocks by them (write side)
            self.kv.cache_blocks(r.index, r.all_token_ids, res.num_final_tokens, self._lookahead(r))
            if r.finished:
                self._remove(r)
                finished.append(r)
        record = StepRecord(out.num_speculative_tokens, bool(out.prefills), tuple(rounds))
        if (t := result.timing) is not None:        # the step's timing parts and its overhead beyond them
            record = dataclasses.replace(record, timed=True, verify_s=t.verify_s, draft_s=t.draft_s,
                                         prefill_module_tokens=t.num_prefill_module_tokens,
                                         prefill_draft_s=t.prefill_draft_s,
                                         catch_up_module_tokens=t.num_catch_up_module_tokens,
                                         catch_up_s=t.catch_up_s,
                                         wall_s=self.clock() - self._step_start)
        self.draft_length.observe(record)
        return finished

    def _append(self, r: Request, res, now: float) -> None:
        """Append verified tokens; stop at a stop token, a stop string (one ending in the text of
        output token min_tokens or later; stop ids are masked before, mtpx.engine.logits.process_logits),
        max_tokens or max_model_len. Tokens after the stop are dropped: the round's raw accepted
        count stays, its committed count is what was appended (SpecDecodeCounts.record_round)."""
        if r.first_token_time is None:
            r.first_token_time = now
        r.emission_times.append(now)
        emitted = 0
        for i, t in enumerate(res.token_ids):
            r.output_token_ids.append(t)
            if res.logit_gaps is not None:
                r.logit_gaps.append(res.logit_gaps[i])
            if res.logprobs is not None:
                r.logprobs.append(res.logprobs[i])
            emitted = i + 1
            if t in r.stop_ids:
                r.finish_reason = "stop"
                r.stop_reason = t if t in r.params.stop_token_ids else None
            elif (r.stop_strings is not None and len(r.output_token_ids) >= r.params.min_tokens
                  and (matched := r.stop_strings.check(r.output_token_ids,
                                                       len(r.output_token_ids) == r.params.min_tokens))):
                r.finish_reason, r.stop_reason = "stop", matched
            elif len(r.output_token_ids) >= r.params.max_tokens or r.num_tokens >= self.max_model_len:
                r.finish_reason = "length"
            if r.finish_reason is not None:
                r.finish_time = now
                break
        r.spec.record_round(res.num_draft_tokens, res.num_accepted, emitted)

    def abort(self, r: Request) -> bool:
        """End a waiting or running request now (finish_reason "abort") and free its blocks.
        Returns False (nothing changed) when it already finished or was never added."""
        if r.finished or (r not in self.running and r not in self.waiting):
            return False
        r.finish_reason = "abort"
        r.finish_time = time.perf_counter()
        self._remove(r)
        return True

    def _remove(self, r: Request) -> None:
        self._ids.discard(r.index)
        self._removed.append(r.index)
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
        self.kv.free(r.index)
