"""Continuous-batching scheduler (vLLM v1's design, simplified): every step it hands out a token
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

from collections import deque
from dataclasses import dataclass, field

from mtpx.cache.kv_cache_manager import KVCacheManager
from mtpx.engine.request import Request


@dataclass
class ScheduledPrefill:
    """Positions [start, start + num_tokens) of `request` run through the target this step;
    is_last: the chunk reaches the last known token, so the target samples the next one and the
    speculator drafts; new: the request was admitted this step (it needs a batch slot, its tokens
    in the token buffer, and its recurrent state from the prefix hit at `start`)."""

    request: Request
    start: int
    num_tokens: int
    is_last: bool
    new: bool = False


@dataclass
class ScheduledDecode:
    """A verification window [x_n, d_1 .. d_num_draft_tokens] for `request`."""

    request: Request
    num_draft_tokens: int


@dataclass
class SchedulerOutput:
    prefills: list[ScheduledPrefill] = field(default_factory=list)
    decodes: list[ScheduledDecode] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return (sum(p.num_tokens for p in self.prefills)
                + sum(1 + d.num_draft_tokens for d in self.decodes))


class Scheduler:
    """kv: the block manager; max_num_seqs: running requests at most (batch slots);
    max_num_batched_tokens: target tokens per step; num_lookahead_tokens: positions beyond a
    step's last token the speculator may write (blocks are allocated for them too);
    max_len: positions a request's block table can cover.

    Requests are added with add(); schedule() returns one step's work (the engine releases the
    batch slots of out.preempted and assigns slots to new prefills); the engine calls
    finish(request) when a request ends or is aborted.
    """

    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 num_lookahead_tokens: int, max_len: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.lookahead = num_lookahead_tokens
        self.max_len = max_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _slots(self, request: Request, end: int) -> int:
        return min(self.max_len, end + self.lookahead)

    def schedule(self, draft_budget) -> SchedulerOutput:
        """draft_budget(request) -> drafts the request can still use (ARCHITECTURE.md inv. 7)."""
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
                n = 1 + min(draft_budget(r), budget - 1)
                need = r.num_tokens - 1 + n
            while not self.kv.allocate_slots(r.index, self._slots(r, need)):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is r:
                    break
            if r not in self.running:               # r itself was preempted
                break
            if r.is_prefilling:
                out.prefills.append(ScheduledPrefill(r, r.num_computed_tokens, n,
                                                     r.num_computed_tokens + n == r.num_tokens))
            else:
                out.decodes.append(ScheduledDecode(r, n - 1))
            budget -= n
            i += 1
        if out.preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            tokens = r.all_token_ids
            hit_blocks, hit = self.kv.get_computed_blocks(r.index, tokens)
            remaining = len(tokens) - hit
            n = min(remaining, budget)
            if n < remaining:
                n -= n % S
            if n == 0 or not self.kv.allocate_slots(r.index, self._slots(r, hit + n), hit_blocks):
                break
            self.waiting.popleft()
            r.num_computed_tokens = hit
            if not r.admitted_once:
                r.num_cached_tokens = hit
                r.admitted_once = True
            self.running.append(r)
            out.prefills.append(ScheduledPrefill(r, hit, n, hit + n == len(tokens), new=True))
            budget -= n
        return out

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        self.kv.free(r.index)
        r.num_computed_tokens = 0
        r.draft_token_ids = []
        r.draft_probs = None
        r.num_preemptions += 1
        self.waiting.appendleft(r)

    def finish(self, r: Request) -> None:
        """Release a finished or aborted request's blocks at once."""
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
        self.kv.free(r.index)
