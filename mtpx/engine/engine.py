"""The decoding engine: continuous batching over a paged KV cache with prefix caching and MTP.

One step (ARCHITECTURE.md, "Data flow"): the scheduler hands out the token budget (verification
windows of running requests, chunks of prompts being prefilled, newly admitted requests) and
allocates their KV blocks, preempting when the pool runs out -> the target runs the prefill chunks
and the verification windows [x_n, d_1..d_k] (keeping the Gated DeltaNet state after every window
token) -> greedy verification accepts the longest prefix of drafts equal to the target's argmax,
plus the target's next token -> the recurrent state at the accepted position is selected -> the
speculator drafts (re-prefilling stale draft-module KV) -> full blocks whose KV is final are
published to the prefix cache -> finished requests release their blocks.

Prefix caching with MTP (shared/seeds/000_*, the three cache mechanisms; the rule of what a block
may hold and its key is KVCacheManager's, mtpx/cache/kv_cache_manager.py):
- write side: a block is published only when every position in it is final for the target and for
  every draft module: computed from committed tokens (the speculator's num_final) and never to be
  rewritten. A request that ends right after a verification that emitted a bonus token never
  re-prefills, so the module KV that read the rejected draft there is not final.
- read side: blocks are keyed on the num_lookahead_tokens tokens after them, so a hit holds
  draft-module KV computed from this request's own tokens.
- freeing side: a request's blocks are released only when it leaves the running set (finish,
  abort, preemption), never while it runs; a request that ends during a step is left out of that
  step's drafting; and draft-module KV lives at the position of the hidden state it reads
  (j <= n - 1, inside the accepted sequence), so every block a pending re-prefill writes is still
  owned by the request when the re-prefill runs (check_invariants asserts it on every write).
Hybrid models: the Gated DeltaNet/conv state at every full block boundary is stored with the block
(ModelCache boundary states), so a hit resumes the recurrence exactly.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass

import torch

from mtpx.cache.kv_cache_manager import KVCacheManager
from mtpx.cache.model_cache import ModelCache
from mtpx.engine.compiled import CompiledDecode, block_bucket
from mtpx.engine.request import Request
from mtpx.engine.sampler import DraftSampler, RequestSampling, sample
from mtpx.engine.scheduler import ScheduledDecode, ScheduledPrefill, Scheduler
from mtpx.models.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM
from mtpx.spec.common import last_valid
from mtpx.spec.verification import VERIFIERS

DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


@dataclass
class StepTiming:
    """Wall time of one engine step's phases (seconds; on CUDA the device is synchronized at each
    boundary, so the times are device times), for the cost model (mtpx.metrics.cost_model).

    Attributes:
        num_decodes: requests verified this step (the batch of the verification forward).
        num_draft_tokens: draft tokens verified this step, summed over those requests.
        num_prefill_tokens: prompt tokens prefilled this step.
        prefill_s: the prefill forward, its first tokens and the drafts proposed after it.
        verify_s: the target forward over the verification windows, verification, the
            recurrent-state commit and the emission of accepted tokens.
        draft_s: the speculator's proposal after verification (draft loop + re-prefill).
    """

    num_decodes: int
    num_draft_tokens: int
    num_prefill_tokens: int
    prefill_s: float
    verify_s: float
    draft_s: float


class Engine:
    """model: the target with its MTP modules; speculator: None (plain decoding) or an MTP
    speculator; max_num_seqs: running requests at most; max_model_len: positions per request
    (prompt + output); block_size: tokens per KV block; num_blocks: KV blocks in the pool (None:
    enough for max_num_seqs requests of max_model_len, so nothing is ever preempted);
    enable_prefix_caching: share full blocks across requests by content; max_num_batched_tokens:
    target tokens per step (prefills are chunked to fit); record_logit_gaps: keep the top-2 logit
    gap of every emitted token; check_invariants: assert on every KV write that no published block
    is written, and the block pool's bookkeeping after every step (tests); verify: "standard"
    (token-level speculative sampling) or "block" (block verification) for requests with
    temperature > 0 (mtpx/spec/verification.py; greedy requests verify by argmax either way);
    draft_sample_method: "greedy" (argmax drafts, one-hot draft distribution) or "probabilistic"
    (drafts sampled from the draft distribution, processed like the target's); attention_backend:
    "torch" or "flashinfer" (CUDA; mtpx.attention.backend), planned once per forward;
    record_step_timings: keep a StepTiming per step (on CUDA this synchronizes the device at each
    phase boundary; False for runs that must not sync, e.g. under CUDA graphs); compile: run the
    decode step (verification forward and the speculator's draft loop) through torch.compile with
    static shapes (mtpx/engine/compiled.py; "reduce-overhead" CUDA graphs on GPU), compiled at
    the first decode step or by warmup(); compile_backend: torch.compile's backend ("inductor";
    "eager"/"aot_eager" trace without code generation, for tests).

    Raises ValueError naming the config key for values it cannot run with.
    """

    def __init__(self, model: MTPForCausalLM, speculator=None, max_num_seqs: int = 64,
                 max_model_len: int | None = None, record_logit_gaps: bool = False,
                 block_size: int = 16, num_blocks: int | None = None,
                 enable_prefix_caching: bool = False, max_num_batched_tokens: int = 2048,
                 check_invariants: bool = False, verify: str = "standard",
                 draft_sample_method: str = "greedy", attention_backend: str = "torch",
                 record_step_timings: bool = True, compile: bool = False,
                 compile_backend: str = "inductor"):
        if verify not in VERIFIERS:
            raise ValueError(f"verify={verify!r}: choose one of {sorted(VERIFIERS)} (spec.verify)")
        if draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise ValueError(f"draft_sample_method={draft_sample_method!r}: choose one of "
                             f"{list(DRAFT_SAMPLE_METHODS)} (spec.draft_sample_method)")
        self.verify = verify
        self.verifier = VERIFIERS[verify]
        self.draft_sample_method = draft_sample_method
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs}: need at least one batch slot "
                             "(engine.max_num_seqs >= 1)")
        limit = model.cfg.max_position_embeddings
        max_model_len = limit if max_model_len is None else max_model_len
        if not 2 <= max_model_len <= limit:
            raise ValueError(f"max_model_len={max_model_len}: must be in [2, {limit}] "
                             "(the model's max_position_embeddings; engine.max_model_len)")
        self.k = 0 if speculator is None else speculator.k
        if block_size < 1:
            raise ValueError(f"block_size={block_size}: must be >= 1 (engine.block_size)")
        if max_num_batched_tokens < max(block_size, self.k + 1):
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens}: must be at least "
                             f"block_size ({block_size}) and num_speculative_tokens + 1 "
                             f"({self.k + 1}) (engine.max_num_batched_tokens)")
        self.model = model
        self.device = next(model.parameters()).device
        self.speculator = speculator
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.record_logit_gaps = record_logit_gaps
        self.lookahead = 0 if speculator is None else speculator.num_lookahead_tokens
        self.max_len = max_model_len + 2 * self.k + 2          # + window, drafts, transient draft KV
        self.block_size = block_size
        blocks_per_seq = -(-self.max_len // block_size)
        self.num_blocks = max_num_seqs * blocks_per_seq if num_blocks is None else num_blocks
        hybrid = any(t == "linear_attention" for t in model.cfg.layer_types)
        self.boundary_states = enable_prefix_caching and hybrid
        self.kv = KVCacheManager(self.num_blocks, block_size, enable_prefix_caching, self.lookahead)
        self.cache = ModelCache(model, max_num_seqs, self.max_len,
                                0 if speculator is None else speculator.num_draft_modules,
                                block_size, self.num_blocks, self.boundary_states, attention_backend)
        if speculator is not None:
            speculator.allocate(self.cache)
        self.scheduler = Scheduler(self.kv, max_num_seqs, max_num_batched_tokens, self.k, self.max_len)
        self.check_invariants = check_invariants
        if check_invariants:
            for c in self.cache.kv_caches:
                c.guard = self._guard_published
        self._on_finish = None
        self._in_flight = 0
        self._slot_freed = 0.0
        self.num_steps = 0
        self.num_preemptions = 0
        self.step_timings: list[StepTiming] = []   # one per step of the last run()
        self.record_step_timings = record_step_timings
        self.compiled = (CompiledDecode(model, self.cache, speculator, compile_backend)
                         if compile else None)

    # ---- public API ---------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, requests: list[Request], on_finish=None, on_step=None,
            max_concurrency: int | None = None) -> None:
        """Generate for every request in place (output_token_ids, finish_reason, spec counts,
        timestamps). Requests arrive at their arrival_offset (seconds after the start) with at most
        max_concurrency in the engine at once (a benchmark client's limit; None = no limit).
        on_finish(request) is called as each one ends; on_step(engine) after every step (both may
        call abort). Runs under torch.inference_mode, whatever the caller's mode, so the compiled
        decode step always sees the same kind of tensors (engine.compile never recompiles for it)."""
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency}: must be >= 1 or None "
                             "(eval.concurrency)")
        self._on_finish = on_finish
        self.step_timings = []
        pending = deque(sorted(requests, key=lambda r: r.arrival_offset))
        start = time.perf_counter()
        self._in_flight = 0
        self._slot_freed = start
        while pending or self.scheduler.has_work():
            now = time.perf_counter()
            while pending and (max_concurrency is None or self._in_flight < max_concurrency) \
                    and pending[0].arrival_offset <= now - start:
                r = pending.popleft()
                if r.finished:                  # aborted before it arrived
                    if on_finish is not None:
                        on_finish(r)
                    continue
                # it arrived at its offset, or when the client got a free slot (whichever is later)
                self._add(r, min(now, max(start + r.arrival_offset, self._slot_freed)))
            if not self.scheduler.has_work():
                if pending and (max_concurrency is None or self._in_flight < max_concurrency):
                    time.sleep(max(0.0, pending[0].arrival_offset - (now - start)))
                continue
            self.step()
            if on_step is not None:
                on_step(self)

    def warmup(self) -> dict | None:
        """With compile: run short dummy requests through prefill and several decode steps, two
        at once and then three at once (two capture sizes: code after a graph break compiles
        again as dynamic on the second), so that the compiled functions exist before anything
        is timed; the prefix cache is reset afterwards. Returns compile_stats() (None without
        compile)."""
        if self.compiled is None:
            return None
        from mtpx.engine.sampling_params import SamplingParams
        max_tokens = 2 * self.k + 3
        # a prompt that fits the model length and, with its output and drafts, the KV pool
        room = min(self.max_model_len - 1, self.num_blocks * self.block_size - 2 * self.k - 2) - max_tokens
        length = min(self.block_size + 1, room)
        if length >= 1:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            vocab = self.model.cfg.vocab_size
            for batch in (2, 3):
                self.run([Request(i, [(7 * i + j) % vocab for j in range(length)], params)
                          for i in range(batch)])
            self.kv.reset_prefix_cache()
            self.step_timings = []
        if self.compiled.num_calls == 0:
            print(f"engine.compile: warm-up could not decode (engine.num_blocks={self.num_blocks} or "
                  f"max_model_len={self.max_model_len} is too small for a short request with "
                  f"{self.k} drafts): the first decode step will compile", file=sys.stderr)
        return self.compile_stats()

    def compile_stats(self) -> dict | None:
        """{"compile_s": seconds spent in calls that compiled, "num_graphs": graphs compiled (0
        when an earlier engine of this process compiled the same graphs and Dynamo reuses them),
        "capture_sizes": padded batch sizes, "mode", "backend"}, or None without compile."""
        c = self.compiled
        if c is None:
            return None
        return {"compile_s": round(c.compile_s, 3), "num_graphs": c.num_graphs,
                "capture_sizes": c.sizes, "mode": c.mode or "default", "backend": c.backend}

    def abort(self, request: Request) -> None:
        """End a waiting or running request now (finish_reason "abort"): its blocks and batch slot
        are released at once; the other requests are untouched."""
        if request.finished:
            return
        request.finish_reason = "abort"
        request.finish_time = time.perf_counter()
        self._release(request)

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> None:
        out = self.scheduler.schedule(self._draft_budget)
        self.num_steps += 1
        for r in out.preempted:
            self.cache.free_row(r.row)
            r.row = -1
            self.num_preemptions += 1
        new = [p for p in out.prefills if p.new]
        for p in new:
            self._admit(p)
        for item in out.prefills + out.decodes:
            r = item.request
            self.cache.set_block_table(r.row, self.kv.block_table(r.index))
        t0 = self._now()
        self._prefill(out.prefills)
        t1 = self._now()
        # after the prefill: an on_finish callback there may have aborted a scheduled decode
        decodes = [d for d in out.decodes if not d.request.finished]
        verify_s, draft_s = self._decode(decodes)
        if self.record_step_timings:
            self.step_timings.append(StepTiming(
                len(decodes), sum(d.num_draft_tokens for d in decodes),
                sum(p.num_tokens for p in out.prefills), t1 - t0, verify_s, draft_s))
        for item in out.prefills + out.decodes:
            r = item.request
            if r.finished:
                continue
            self.kv.cache_blocks(r.index, r.all_token_ids, self._num_final(r))
        if self.check_invariants:
            self.kv.check_invariants()

    def _add(self, r: Request, now: float) -> None:
        r.arrival_time = now
        if not r.params.greedy and r.generator is None:
            r.generator = torch.Generator()
            r.generator.manual_seed(r.params.seed if r.params.seed is not None
                                    else int(torch.randint(2**62, (1,))))
        worst = min(self.max_len, len(r.prompt_token_ids) + r.params.max_tokens + 2 * self.k + 2)
        need = -(-worst // self.block_size)
        if need > self.num_blocks:
            r.error = (f"request needs up to {need} KV blocks of {self.block_size} tokens but the "
                       f"pool has {self.num_blocks}: raise engine.num_blocks or lower max_tokens")
            if self._on_finish is not None:
                self._on_finish(r)
            return
        self._in_flight += 1
        self.scheduler.add(r)

    def _admit(self, p: ScheduledPrefill) -> None:
        """A request enters the running set: batch slot, known tokens, recurrent state (from the
        boundary state of its last prefix-hit block), speculator bookkeeping."""
        r, cache = p.request, self.cache
        r.row = cache.allocate_row()
        tokens = r.all_token_ids
        cache.tokens[r.row, : len(tokens)] = torch.tensor(tokens, device=self.device)
        rows = torch.tensor([r.row], device=self.device)
        if p.start > 0:
            block = self.kv.block_table(r.index)[p.start // self.block_size - 1]
            for c in cache.recurrent:
                c.load_rows(rows, torch.tensor([block], device=self.device))
        if self.speculator is not None:
            self.speculator.reset_rows(rows, p.start)

    def _num_final(self, r: Request, num_read_tokens: int | None = None) -> int:
        """Positions whose KV is final for the target and every draft module (write side).
        num_read_tokens: leading committed tokens that are what the draft modules read (default:
        all of them, as after a draft round)."""
        final = r.num_computed_tokens
        if self.speculator is not None:
            read = r.num_tokens if num_read_tokens is None else num_read_tokens
            final = min(final, self.speculator.num_final(r.row, read))
        return final

    def _boundaries(self, meta, upto: torch.Tensor | None = None):
        """(batch_idx, token_idx, block_ids) of the tokens that end a block (and, for verification
        windows, are accepted: token_idx <= upto[b])."""
        if not self.boundary_states:
            return None
        S = self.block_size
        mask = meta.valid & ((meta.positions + 1) % S == 0)
        if upto is not None:
            mask &= torch.arange(mask.shape[1], device=mask.device)[None] <= upto[:, None]
        bi, ti = mask.nonzero(as_tuple=True)
        return bi, ti, meta.block_table[bi, meta.positions[bi, ti] // S]

    def _prefill(self, prefills: list[ScheduledPrefill]) -> None:
        if not prefills:
            return
        cache, model, dev = self.cache, self.model, self.device
        reqs = [p.request for p in prefills]
        rows = torch.tensor([r.row for r in reqs], device=dev)
        meta = cache.meta(torch.tensor([p.start for p in prefills], device=dev),
                          torch.tensor([p.num_tokens for p in prefills], device=dev), rows)
        meta.save_states = self._boundaries(meta)
        ids = torch.where(meta.valid, cache.tokens[rows[:, None], meta.positions], 0)
        h = model.model(ids, meta, cache.target)                           # [B, T, hidden]
        for p in prefills:
            p.request.num_computed_tokens += p.num_tokens
        last = [b for b, p in enumerate(prefills) if p.is_last]
        if last:
            idx = torch.tensor(last, device=dev)
            logits = model.lm_head(last_valid(h, meta)[idx])               # [L, vocab]
            sampling = self._sampling([reqs[b] for b in last])
            if sampling.all_greedy:
                tok = logits.argmax(-1)
            else:
                tok = sample(sampling.probs(logits), sampling.uniforms([1] * len(last))[:, 0])
            cache.tokens[rows[idx], torch.tensor([reqs[b].num_tokens for b in last], device=dev)] = tok
            gaps = self._gaps(logits[:, None])
            for j, b in enumerate(last):
                self._emit(reqs[b], [int(tok[j])], gaps[j] if gaps is not None else None, 0, 0)
        draft = torch.tensor([p.is_last for p in prefills], device=dev)
        self._propose(reqs, rows, meta, h, draft)

    def _now(self) -> float:
        """perf_counter for the step timings; on CUDA the device is synchronized first (phases
        are device work), so record_step_timings=False skips it: no syncs, no timings."""
        if not self.record_step_timings:
            return 0.0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _decode(self, decodes: list[ScheduledDecode]) -> tuple[float, float]:
        """Verify the decodes' windows and draft for them; returns (verify_s, draft_s)."""
        if not decodes:
            return 0.0, 0.0
        t0 = self._now()
        cache, model, dev = self.cache, self.model, self.device
        reqs = [d.request for d in decodes]
        B = len(reqs)
        rows = torch.tensor([r.row for r in reqs], device=dev)
        n = torch.tensor([r.num_tokens - 1 for r in reqs], device=dev)
        num_drafts = torch.tensor([d.num_draft_tokens for d in decodes], device=dev)
        if self.compiled is None:
            meta = cache.meta(n, 1 + num_drafts, rows, keep_states=True)
            ids = torch.where(meta.valid, cache.tokens[rows[:, None], meta.positions], 0)  # x_n, d_1..
            h = model.model(ids, meta, cache.target)
            logits = model.lm_head(h)                                      # [B, T, vocab]
            full_meta, full_h = meta, h
        else:  # static shapes: batch padded to a capture size, windows of k + 1 (compiled.py)
            Bp = self.compiled.padded_batch(B)
            pad = lambda x, v: torch.cat([x, x.new_full((Bp - B,), v)])  # noqa: E731
            # every position this step touches (drafts reach n + 2k - 1) lies in the bucket
            nb = block_bucket(max(r.num_tokens for r in reqs) + 2 * self.k + 1, self.block_size,
                              cache.max_blocks)
            full_meta = cache.static_meta(pad(n, 0), pad(1 + num_drafts, 0), pad(rows, cache.pad_row),
                                          self.k + 1, nb, keep_states=True)
            full_ids, full_h, full_logits = self.compiled.verify(full_meta)
            ids, h, logits = full_ids[:B], full_h[:B], full_logits[:B]
            meta = ForwardMeta(full_meta.positions[:B], full_meta.valid[:B], rows, None)
        sampling = self._sampling(reqs)
        if sampling.all_greedy:
            target = logits.argmax(-1)                                     # [B, T]
            match = (ids[:, 1:] == target[:, :-1]) & meta.valid[:, 1:]
            accepted = match.long().cumprod(1).sum(1)                     # [B] = m
        else:
            accepted, target = self._verify_sampled(reqs, ids, logits, num_drafts, sampling)
        full_accepted = torch.cat([accepted, accepted.new_zeros(full_meta.rows.shape[0] - B)])
        cache.commit_recurrent(full_accepted, self._boundaries(full_meta, full_accepted))
        gaps = self._gaps(logits)
        # known tokens x_{n+1..n+m+1} = target[:, :m+1] (accepted drafts, then the bonus token)
        keep = torch.arange(target.shape[1], device=dev)[None] <= accepted[:, None]     # [B, T]
        cache.tokens[rows[:, None].expand_as(target)[keep], (meta.positions + 1)[keep]] = target[keep]
        emitted_tokens, accepted_list = target.tolist(), accepted.tolist()
        for b, r in enumerate(reqs):
            if r.finished:          # aborted by an earlier request's on_finish in this loop
                continue
            m = accepted_list[b]
            # set before _emit: a request that finishes there publishes its final blocks
            r.num_computed_tokens = r.num_tokens - 1 + m + 1
            self._emit(r, emitted_tokens[b][: m + 1], gaps[b] if gaps is not None else None,
                       int(num_drafts[b]), m)
            r.num_computed_tokens = min(r.num_computed_tokens, r.num_tokens - 1)
        t1 = self._now()
        if self.speculator is None:
            return t1 - t0, 0.0
        if self.compiled is not None and not self._needs_draft_sampler(reqs):
            self._propose_static(reqs, full_meta, full_h, nb)
        else:
            new = cache.meta(n, accepted + 1, rows)                        # accepted positions n..n+m
            self._propose(reqs, rows, new, h[:, : new.valid.shape[1]],
                          torch.ones(len(reqs), dtype=torch.bool, device=dev))
        return t1 - t0, self._now() - t1

    def _needs_draft_sampler(self, reqs: list[Request]) -> bool:
        return (self.draft_sample_method == "probabilistic"
                and any(not r.params.greedy for r in reqs if not r.finished))

    def _propose_static(self, reqs, meta, hidden, num_blocks: int) -> None:
        """The compiled draft loop after a static verification (meta, hidden: its padded batch):
        requests that finished this step become padding (the pad row)."""
        cache, dev, B = self.cache, self.device, len(reqs)
        Bp = meta.rows.shape[0]
        live = torch.tensor([not r.finished for r in reqs] + [False] * (Bp - B), device=dev)
        rows = torch.where(live, meta.rows, cache.pad_row)
        num_tokens = torch.tensor([r.num_tokens for r in reqs] + [1] * (Bp - B), device=dev)
        metas = self.speculator.plan_decode(cache, rows, num_tokens, live, num_blocks)
        drafts = self.compiled.draft(metas, rows, num_tokens - 1, meta.positions[:, 0], hidden)
        drafts = drafts.tolist()
        for b, r in enumerate(reqs):
            if not r.finished:
                r.draft_token_ids, r.draft_probs = drafts[b], None

    # ---- helpers ------------------------------------------------------------------------------
    def _draft_budget(self, r: Request) -> int:
        """Never propose more drafts than the request can still use (ARCHITECTURE.md inv. 7)."""
        if self.speculator is None:
            return 0
        room = min(r.params.max_tokens - len(r.output_token_ids),
                   self.max_model_len - r.num_tokens)
        return max(0, min(len(r.draft_token_ids), room - 1))

    def _propose(self, reqs, rows, meta, hidden, draft) -> None:
        """Draft for this step's requests that are still running (draft[b] False: mid-prefill,
        the modules only catch up); meta/hidden: the target's newly final positions ([B, T, ...])."""
        keep = [b for b, r in enumerate(reqs) if not r.finished]
        if self.speculator is None or not keep:
            return
        if len(keep) < len(reqs):
            idx = torch.tensor(keep, device=self.device)
            rows, hidden, draft, meta = rows[idx], hidden[idx], draft[idx], meta.select(idx)
        num_tokens = torch.tensor([reqs[b].num_tokens for b in keep], device=self.device)
        kept = [reqs[b] for b in keep]
        sampling = self._sampling(kept)
        extra = {}
        if not sampling.all_greedy and self.draft_sample_method == "probabilistic":
            extra["sampler"] = DraftSampler(sampling, draft, self.k, probabilistic=True)
        drafts = self.speculator.propose(self.cache, rows, num_tokens, meta, hidden, draft,
                                         **extra).tolist()
        q = extra["sampler"].q if extra else None
        for j, r in enumerate(kept):
            r.draft_token_ids = drafts[j] if bool(draft[j]) else []
            r.draft_probs = q[j] if q is not None and bool(draft[j]) else None

    def _sampling(self, reqs: list[Request]) -> RequestSampling:
        return RequestSampling([r.params for r in reqs], [r.generator for r in reqs], self.device)

    def _verify_sampled(self, reqs, ids, logits, num_drafts, sampling: RequestSampling):
        """Verification at temperature > 0 (greedy rows of the batch get one-hot target
        distributions, which reduces to argmax matching). Returns (accepted [B], emitted [B, T]:
        the accepted drafts then the final token at index accepted[b])."""
        B, T = ids.shape
        p = sampling.probs(logits)                                         # [B, T, V]
        x = ids[:, 1:]                                                     # drafts [B, T-1]
        nd = num_drafts.tolist()
        if T > 1:
            V = p.shape[-1]
            q = torch.nn.functional.one_hot(x, V).to(p.dtype)              # greedy drafts
            for b, r in enumerate(reqs):
                if r.draft_probs is not None and nd[b]:
                    q[b, : nd[b]] = r.draft_probs[: nd[b]].to(p.dtype)
            eta = sampling.uniforms(nd, T - 1)
            accepted, final = self.verifier(x, q, p, num_drafts, eta)
        else:
            accepted, final = torch.zeros(B, dtype=torch.long, device=ids.device), p[:, 0]
        y = sample(final, sampling.uniforms([1] * B)[:, 0])
        emitted = torch.cat([x, torch.zeros(B, 1, dtype=x.dtype, device=x.device)], 1)
        emitted[torch.arange(B, device=ids.device), accepted] = y
        return accepted, emitted

    def _gaps(self, logits: torch.Tensor):
        if not self.record_logit_gaps:
            return None
        top2 = logits.float().topk(2, dim=-1).values
        return (top2[..., 0] - top2[..., 1]).tolist()                      # [B][T]

    def _emit(self, r: Request, tokens: list[int], gaps, num_draft_tokens: int, num_accepted: int):
        """Append verified tokens; stop at a stop token, max_tokens or max_model_len. Tokens after
        the stop are dropped: num_accepted is the verifier's raw count, the committed count is
        what was appended (SpecDecodeCounts.record_round)."""
        now = time.perf_counter()
        if r.first_token_time is None:
            r.first_token_time = now
        r.emission_times.append(now)
        emitted = 0
        for i, t in enumerate(tokens):
            r.output_token_ids.append(t)
            if gaps is not None:
                r.logit_gaps.append(gaps[i])
            emitted = i + 1
            if t in r.stop_ids:
                r.finish_reason = "stop"
            elif len(r.output_token_ids) >= r.params.max_tokens or r.num_tokens >= self.max_model_len:
                r.finish_reason = "length"
            if r.finish_reason is not None:
                r.finish_time = now
                break
        r.spec.record_round(num_draft_tokens, num_accepted, emitted)
        if r.finish_reason is not None:
            # the draft modules read this emission's tokens only where they were accepted drafts
            self._release(r, r.num_tokens - (emitted > num_accepted))

    def _release(self, r: Request, num_read_tokens: int | None = None) -> None:
        """Free a finished request's blocks and batch slot at once (the rest of the step skips it).
        num_read_tokens: as _num_final's."""
        was_queued = r in self.scheduler.running or r in self.scheduler.waiting
        if r.finish_reason is not None and r.row >= 0:
            # publish what is final before the blocks go back (write side)
            self.kv.cache_blocks(r.index, r.all_token_ids, self._num_final(r, num_read_tokens))
        self.scheduler.finish(r)
        if r.row >= 0:
            self.cache.free_row(r.row)
            r.row = -1
        if was_queued:
            self._in_flight -= 1
            self._slot_freed = time.perf_counter()
            if self._on_finish is not None:
                self._on_finish(r)

    def _guard_published(self, slots: torch.Tensor) -> None:
        """check_invariants: no KV write lands in a published block (invariant 4) or in a block
        nobody holds (a freed block: invariant 5, the freeing side)."""
        blocks = [b for b in torch.unique(slots // self.block_size).tolist() if b < self.num_blocks]
        bad = [b for b in blocks if self.kv.pool.is_published(b)]
        assert not bad, f"write into published prefix-cache blocks {bad}"
        free = [b for b in blocks if self.kv.pool.ref_cnt[b] == 0]
        assert not free, f"write into free KV blocks {free}"
