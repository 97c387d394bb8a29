"""The decoding engine: continuous batching over a paged KV cache with prefix caching and MTP.

An online API, as vLLM's LLMEngine: `add_request`, `step`, `abort`, `has_unfinished_requests`.
One step has one direction (docs/architecture.md):

    out = scheduler.schedule()                  # token budget, KV blocks, preemption
    result = runner.execute(out)                # RunnerOutput: tokens, accepted, drafts, final
    finished = scheduler.update_from_output(out, result)   # progress, stops, publish, free
    runner.release(finished)                    # their batch slots

Callbacks belong to the caller and run after `step` returns (the client loop of
mtpx/engine/llm.py). Where the prefix-caching rules live: what a block may hold and its key,
KVCacheManager (mtpx/cache/kv_cache_manager.py); which positions are final, the runner and the
speculator (Speculator.num_final); freeing side: blocks go back only when a request leaves the
running set, and a re-prefill writes only positions inside the request's accepted sequence, so
every block it writes is still the request's own (check_invariants asserts it on every write).
Hybrid models: the Gated DeltaNet/conv state at every full block boundary is stored with the
block (ModelCache boundary states), so a hit resumes the recurrence exactly.
"""
from __future__ import annotations

import dataclasses
import sys

import torch

from mtpx.cache.kv_cache_manager import KVCacheManager
from mtpx.engine.compiled import depth_bucket
from mtpx.engine.config import EngineConfig, with_overrides
from mtpx.engine.auto_k.policy import AutoDraftLength, FixedDraftLength
from mtpx.engine.model_runner import ModelRunner, StepTiming
from mtpx.engine.request import Request
from mtpx.engine.sampling_params import SamplingParams
from mtpx.engine.scheduler import Scheduler

__all__ = ["Engine", "EngineConfig", "StepTiming"]


class Engine:
    """model: the target with its MTP modules; speculator: None (plain decoding) or a Speculator
    (mtpx/spec_decode/protocol.py); config: an EngineConfig, with `overrides` of its fields applied;
    draft_length: None (every step proposes the speculator's num_speculative_tokens) or an
    AutoDraftLength over 0 .. that many (mtpx/engine/auto_k/policy.py; without step costs, call
    mtpx.engine.auto_k.costs.calibrate_step_costs before decoding).

    Raises ValueError naming the config key for values it cannot run with.
    """

    def __init__(self, model, speculator=None, config: EngineConfig | None = None,
                 draft_length: AutoDraftLength | None = None, **overrides):
        config = with_overrides(config, **overrides)
        tp = getattr(model, "tp", None)
        if (1 if tp is None else tp.world_size) != config.tensor_parallel_size:
            raise ValueError(f"engine.tensor_parallel_size={config.tensor_parallel_size} but the model is split over "
                             f"{1 if tp is None else tp.world_size} rank(s): build it with LLM(model=PATH, "
                             "tensor_parallel_size=N), which shards the checkpoint and starts the ranks")
        k = 0 if speculator is None else speculator.num_speculative_tokens
        limit = model.cfg.max_position_embeddings
        max_model_len = limit if config.max_model_len is None else config.max_model_len
        if not 2 <= max_model_len <= limit:
            raise ValueError(f"max_model_len={max_model_len}: must be in [2, {limit}] "
                             "(the model's max_position_embeddings; engine.max_model_len)")
        if config.max_num_batched_tokens < k + 1:
            raise ValueError(f"max_num_batched_tokens={config.max_num_batched_tokens}: must be at "
                             f"least num_speculative_tokens + 1 ({k + 1}) (engine.max_num_batched_tokens)")
        self.max_len = max_model_len + 2 * k + 2          # + window, drafts, transient draft KV
        blocks_per_seq = -(-self.max_len // config.block_size)
        num_blocks = config.num_blocks or config.max_num_seqs * blocks_per_seq
        self.config = config = dataclasses.replace(config, max_model_len=max_model_len,
                                                   num_blocks=num_blocks)
        self.model, self.num_speculative_tokens = model, k
        lookahead = 0 if speculator is None else speculator.num_lookahead_tokens
        kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching, lookahead)
        if draft_length is None:
            draft_length = FixedDraftLength(k)
        elif draft_length.max_k != k:
            raise ValueError(f"automatic k over 0..{draft_length.max_k} but the speculator drafts {k}")
        self.draft_length = draft_length
        depth_per_request = draft_length.auto and speculator is not None and speculator.num_draft_modules > 1
        self.scheduler = Scheduler(kv, config.max_num_seqs, config.max_num_batched_tokens, draft_length,
                                   self.max_len, max_model_len, lookahead, depth_per_request)
        # automatic k's calibration and depth changes fail a saved graph's guards again and again
        # (each failure compiled one more saved variant): its graphs go through torch.compile
        self.runner = ModelRunner(model, speculator, config, self.max_len, precompile=not draft_length.auto)
        if config.check_invariants:
            self.runner.set_kv_write_guard(self._guard_published)
        self.num_steps = 0
        self.step_timings: list[StepTiming] = []   # one per step since reset_step_timings()
        self._aborted: list[Request] = []

    # ---- views used by callers and tests ---------------------------------------------------------
    @property
    def kv(self) -> KVCacheManager:
        return self.scheduler.kv

    @property
    def cache(self):
        return self.runner.cache

    @property
    def speculator(self):
        return self.runner.speculator

    @property
    def compiled(self):
        return self.runner.compiled

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    def stats(self) -> dict[str, int]:
        """What a server reports between steps: requests running and waiting, KV blocks in the
        pool and free (evictable prefix-cache blocks count as free), batch slots in use."""
        return {"num_running": len(self.scheduler.running), "num_waiting": len(self.scheduler.waiting),
                "num_kv_blocks": self.kv.num_blocks, "num_free_kv_blocks": self.kv.num_free_blocks,
                "num_batch_slots_in_use": self.runner.num_rows_in_use}

    def reset_step_timings(self) -> None:
        """Forget the step timings kept so far (a client starts a measured run)."""
        self.step_timings = []

    # ---- the online API ------------------------------------------------------------------------
    def validate_prompt(self, ids: list[int]) -> str | None:
        """Why the engine cannot run prompt `ids` (empty, too long, a token outside the
        vocabulary), as one line naming the fix; None when it can."""
        if len(ids) == 0:
            return "empty prompt: give at least one token (remove empty lines from the prompt file)"
        if len(ids) >= self.max_model_len:
            return (f"prompt has {len(ids)} tokens but the model's maximum length is "
                    f"{self.max_model_len} (max_model_len): shorten or truncate the prompt")
        vocab = self.model.cfg.vocab_size
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            return f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})"
        return None

    def validate_params(self, params) -> str | None:
        """Why the engine cannot honour SamplingParams `params` (a logit_bias token outside the
        vocabulary), as one line; None when it can."""
        vocab = self.model.cfg.vocab_size
        bad = [t for t in (params.logit_bias or {}) if t >= vocab]
        if bad:
            return f"logit_bias token ids {bad[:5]} are outside the vocabulary [0, {vocab})"
        return None

    def add_request(self, r: Request) -> bool:
        """Queue a request. Returns False, setting r.error, when the engine cannot run its prompt
        (validate_prompt) or honour its params (validate_params) or it can never fit the KV pool:
        it fails alone. Raises ValueError for
        a request that already ran or whose id is in the engine."""
        if r.finished or r.output_token_ids:
            raise ValueError(f"request {r.index!r} was already run: pass a new Request")
        r.error = self.validate_prompt(r.prompt_token_ids) or self.validate_params(r.params)
        if r.error is not None:
            return False
        k = self.runner.num_speculative_tokens
        if len(r.spec.accepted_per_position) < k:   # one entry per draft position, as vLLM reports it
            r.spec.accepted_per_position.extend([0] * (k - len(r.spec.accepted_per_position)))
        if not r.params.greedy and r.generator is None:
            r.generator = torch.Generator()
            r.generator.manual_seed(r.params.seed if r.params.seed is not None
                                    else int(torch.randint(2**62, (1,))))
        worst = min(self.max_len, len(r.prompt_token_ids) + r.params.max_tokens + 2 * self.num_speculative_tokens + 2)
        need = -(-worst // self.config.block_size)
        if need > self.config.num_blocks:
            r.error = (f"request needs up to {need} KV blocks of {self.config.block_size} tokens but "
                       f"the pool has {self.config.num_blocks}: raise engine.num_blocks or lower max_tokens")
            return False
        self.scheduler.add(r)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Request]:
        """One engine step; returns the requests that finished in it (stop or length)."""
        out = self.scheduler.schedule()
        self.num_steps += 1
        with torch.inference_mode():
            result = self.runner.execute(out)
        finished = self.scheduler.update_from_output(out, result)
        for r in finished:
            self.runner.release(r.index)
        if result.timing is not None:
            self.step_timings.append(result.timing)
        if self.config.check_invariants:
            self.kv.check_invariants()
        return finished

    def abort(self, r: Request) -> None:
        """End a waiting or running request now (finish_reason "abort"): its blocks and batch slot
        are released at once; it is reported by pop_aborted()."""
        if self.scheduler.abort(r):
            self.runner.release(r.index)
            self._aborted.append(r)

    def pop_aborted(self) -> list[Request]:
        """Requests aborted since the last call (the client reports them as finished)."""
        out, self._aborted = self._aborted, []
        return out

    # ---- calibration ------------------------------------------------------------------------------
    def time_decode_steps(self, batch_size: int, ks: list[int], context_len: int, rounds: int,
                          warmup: int = 1, seed: int = 0) -> dict[int, list[float]]:
        """Milliseconds of the decode step of batch_size requests at context_len known tokens,
        verifying and proposing k drafts, for each k of ks, alternated call by call over `rounds`
        rounds after `warmup` untimed ones (ModelRunner.time_decode_steps: no prefill, the prompt
        positions are taken as computed). With per-request depth (multi-module MTP and automatic
        k) every request has depth k: the step of a k-module engine. context_len is lowered to
        what the model length and the KV pool allow. Returns {k: [ms per round]}. Raises
        ValueError when the engine has requests or the pool cannot hold the batch."""
        if self.has_unfinished_requests():
            raise ValueError("time the decode steps (calibrate the step costs) before adding requests")
        c, top = self.config, max(ks)
        per_request = c.num_blocks // batch_size * c.block_size - 2 * top - 2
        context_len = min(context_len, c.max_model_len - 1, per_request)
        if context_len < 1 or batch_size > c.max_num_seqs:
            raise ValueError(f"calibration at batch {batch_size}: the engine holds at most {c.max_num_seqs} "
                             f"requests and {c.num_blocks} KV blocks (engine.max_num_seqs, engine.num_blocks)")
        g = torch.Generator().manual_seed(seed)
        vocab = self.model.cfg.vocab_size
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        reqs = [Request(-1 - i, torch.randint(2, vocab, (context_len,), generator=g).tolist(), params)
                for i in range(batch_size)]
        try:
            for r in reqs:
                if not self.kv.allocate_slots(r.index, context_len + 2 * top + 2):
                    raise ValueError(f"calibration at batch {batch_size}: the KV pool of {c.num_blocks} blocks "
                                     "cannot hold it (engine.num_blocks)")
            seconds = self.runner.time_decode_steps(
                reqs, [self.kv.block_table(r.index) for r in reqs], list(ks), rounds, warmup,
                self.scheduler.depth_per_request)
        finally:
            for r in reqs:
                self.kv.free(r.index)
        return {k: [1e3 * s for s in v] for k, v in seconds.items()}

    # ---- compilation ------------------------------------------------------------------------------
    def warmup(self) -> dict | None:
        """With compile: run short dummy requests, two at once, three at once (two capture sizes:
        code after a graph break compiles again as dynamic on the second), then one alone (a
        graph Inductor specialized to batches of two or more compiles for one now), and
        with per-request depths (automatic k) one decode step at each depth bucket
        (compiled.depth_bucket), so the compiled functions exist before anything is timed; the
        prefix cache is reset afterwards. Returns compile_stats() (None without compile)."""
        if self.compiled is None:
            return None
        c, k = self.config, self.num_speculative_tokens
        max_tokens = 2 * k + 3
        # a prompt that fits the model length and, with its output and drafts, the KV pool
        room = min(c.max_model_len - 1, c.num_blocks * c.block_size - 2 * k - 2) - max_tokens
        length = min(c.block_size + 1, room)
        if length >= 1:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            vocab = self.model.cfg.vocab_size
            for batch in (2, 3, 1):
                for i in range(batch):
                    self.add_request(Request(i, [(7 * i + j) % vocab for j in range(length)], params))
                while self.has_unfinished_requests():
                    self.step()
            self.kv.reset_prefix_cache()
            self.step_timings = []
        if self.scheduler.depth_per_request and length >= 1:
            # automatic k: every depth bucket's graphs now, not when a request first reaches it
            ks = sorted({depth_bucket(d, k) for d in range(k + 1)})
            try:
                self.time_decode_steps(min(2, c.max_num_seqs), ks, length, rounds=0, warmup=1)
            except ValueError as err:
                print(f"engine.compile: warm-up of the depths {ks} skipped ({err}): they compile when "
                      "first used", file=sys.stderr)
        stats = self.compile_stats()
        if stats["num_graphs"]:
            print(f"engine.compile: {stats['num_graphs']} graphs in {stats['compile_s']:.1f} s "
                  f"({stats['num_compiled']} compiled, {stats['num_loaded']} loaded from {stats['cache_dir']})",
                  file=sys.stderr, flush=True)
        if self.compiled.num_calls == 0:
            print(f"engine.compile: warm-up could not decode (engine.num_blocks={c.num_blocks} or "
                  f"max_model_len={c.max_model_len} is too small for a short request with {k} "
                  "drafts): the first decode step will compile", file=sys.stderr)
        return self.compile_stats()

    def compile_stats(self) -> dict | None:
        """{"compile_s": seconds spent in calls that built a graph, "num_graphs": graphs built
        (compiled or loaded from the cache), "num_compiled", "num_loaded", "graphs": [{"graph",
        "seconds", "source"}], "regions": compiled layer regions on, "cache_dir",
        "capture_sizes": padded batch sizes, "mode", "backend"}, or None without compile."""
        c = self.compiled
        if c is None:
            return None
        return {**c.progress.summary(), "regions": self.cache.compile_regions, "cache_dir": c.cache_dir,
                "capture_sizes": c.sizes, "mode": c.mode or "default", "backend": c.backend}

    def _guard_published(self, slots: torch.Tensor) -> None:
        """check_invariants: no KV write lands in a published block (invariant 4) or in a block
        nobody holds (a freed block: invariant 5, the freeing side)."""
        num_blocks = self.config.num_blocks
        blocks = [b for b in torch.unique(slots // self.config.block_size).tolist() if b < num_blocks]
        bad = [b for b in blocks if self.kv.pool.is_published(b)]
        assert not bad, f"write into published prefix-cache blocks {bad}"
        free = [b for b in blocks if self.kv.pool.ref_cnt[b] == 0]
        assert not free, f"write into free KV blocks {free}"
