"""The decoding engine: continuous batching over a paged KV cache with prefix caching and MTP.

An online API, as vLLM's LLMEngine: `add_request`, `step`, `abort`, `has_unfinished_requests`.
One step has one direction (docs/architecture.md):

    out = scheduler.schedule()                  # token budget, KV blocks, preemption
    result = runner.execute(out)                # RunnerOutput: tokens, accepted, drafts, final
    finished = scheduler.update_from_output(out, result)   # progress, stops, publish, free
    runner.release(finished)                    # their batch slots

The scheduler side (mtpx/core: Scheduler, KVCacheManager, Request, the draft-length policy)
imports no tensor code; the worker side (ModelRunner, the compiled step, mtpx/cache's ModelCache
and states) owns every tensor; this class holds one of each (docs/architecture.md, "Scheduler side
and worker side").

Callbacks belong to the caller and run after `step` returns (the client loop of
mtpx/engine/llm.py). Where the prefix-caching rules live: what a block may hold and its key,
KVCacheManager (mtpx/core/kv_cache_manager.py); which positions are final, the runner and the
speculator (Speculator.num_final); freeing side: blocks go back only when a request leaves the
running set, and a re-prefill writes only positions inside the request's accepted sequence, so
every block it writes is still the request's own (check_invariants asserts it on every write).
Hybrid models: the Gated DeltaNet/conv state at every full block boundary is stored with the
block (ModelCache boundary states), so a hit resumes the recurrence exactly.
"""
from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

import torch

from mtpx import auto_k
from mtpx.auto_k import AutoDraftLength, calibration, store
from mtpx.core.kv_cache_manager import KVCacheManager
from mtpx.core.request import Request
from mtpx.core.scheduler import Scheduler
from mtpx.engine.config import EngineConfig, with_overrides
from mtpx.engine.decode_step import depth_bucket, depth_buckets
from mtpx.engine import tree_step
from mtpx.engine.tree_choice import AutoChainOrTree, leaf_tree_over
from mtpx.engine.model_runner import ModelRunner, StepTiming
from mtpx.engine.tensor_parallel import TensorParallelRunner
from mtpx.spec_decode.tree_draft import TreeSpeculator

__all__ = ["Engine", "EngineConfig", "StepTiming", "measure_step_costs"]


class Engine:
    """model: the target with its MTP modules; speculator: None (plain decoding) or a Speculator
    (mtpx/spec_decode/protocol.py); config: an EngineConfig, with `overrides` of its fields applied;
    draft_length: None (every step proposes the speculator's num_speculative_tokens) or an
    AutoDraftLength over 0 .. that many (mtpx/auto_k/policy.py; without step costs, call
    `calibrate` before decoding).

    Raises ValueError naming the config key for values it cannot run with.
    """

    def __init__(self, model, speculator=None, config: EngineConfig | None = None,
                 draft_length: AutoDraftLength | None = None, **overrides):
        config = with_overrides(config, **overrides)
        tp = getattr(model, "tp", None)
        if (1 if tp is None else tp.world_size) != config.tensor_parallel_size:
            raise ValueError(f"engine.tensor_parallel_size={config.tensor_parallel_size} but the model is "
                             f"split over {1 if tp is None else tp.world_size} rank(s): build it with "
                             "LLM(model=PATH, tensor_parallel_size=N), which shards the checkpoint and "
                             "starts the ranks")
        k = 0 if speculator is None else speculator.num_speculative_tokens
        # automatic k choosing chain or a leaf tree per step (tree_choice.py): the tree's round is the chain's
        choice = isinstance(draft_length, AutoChainOrTree)
        tree = leaf_tree_over(speculator, config.tree, model) if choice else None
        room = k if tree is None else max(k, tree.num_speculative_tokens)    # drafts a step verifies at most
        limit = model.cfg.max_position_embeddings
        max_model_len = limit if config.max_model_len is None else config.max_model_len
        if not 2 <= max_model_len <= limit:
            raise ValueError(f"max_model_len={max_model_len}: must be in [2, {limit}] "
                             "(the model's max_position_embeddings; engine.max_model_len)")
        if config.max_num_batched_tokens < room + 1:
            raise ValueError(f"max_num_batched_tokens={config.max_num_batched_tokens}: must be at "
                             f"least num_speculative_tokens + 1 ({room + 1}) (engine.max_num_batched_tokens)")
        self.max_len = max_model_len + 2 * room + 2          # + window, drafts, transient draft KV
        blocks_per_seq = -(-self.max_len // config.block_size)
        num_blocks = config.num_blocks or config.max_num_seqs * blocks_per_seq
        self.config = config = dataclasses.replace(config, max_model_len=max_model_len,
                                                   num_blocks=num_blocks)
        self.model, self.num_speculative_tokens = model, k
        lookahead = 0 if speculator is None else speculator.num_lookahead_tokens
        kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching, lookahead)
        auto = draft_length is not None
        # ragged steps cost their tokens: each request verifies its own k (mtpx/auto_k/request_k.py)
        draft_length, depth_per_request = auto_k.for_engine(
            draft_length, k, speculator is not None and speculator.num_draft_modules > 1,
            speculator is not None and config.ragged_batch and config.per_request_k)
        self.draft_length = draft_length
        self.scheduler = Scheduler(kv, config.max_num_seqs, config.max_num_batched_tokens, draft_length,
                                   self.max_len, max_model_len, lookahead, depth_per_request)
        self.scheduler.lookahead = max(self.scheduler.lookahead, room)     # the tree's nodes' KV slots
        # the executor: rank 0 of a tensor-parallel model (its tp_driver) runs every call on all ranks
        driver = getattr(model, "tp_driver", None) if config.tensor_parallel_size > 1 else None
        self.runner = (ModelRunner(model, speculator, config, self.max_len, tree) if driver is None else
                       TensorParallelRunner(model, speculator, config, self.max_len, driver, auto))
        if config.check_invariants:   # before every KV write: no published or free block is written
            self.runner.set_kv_write_guard(
                lambda slots: kv.check_writes(torch.unique(slots // config.block_size).tolist()))
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
        """Why the engine cannot honour SamplingParams `params` (a logit_bias, stop_token_ids or
        allowed_token_ids id outside the vocabulary), as one line starting with the key; None when
        it can."""
        vocab = self.model.cfg.vocab_size
        for key, ids in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids),
                         ("allowed_token_ids", params.allowed_token_ids or [])):
            bad = [t for t in ids if t >= vocab]
            if bad:
                return f"{key} token ids {bad[:5]} are outside the vocabulary [0, {vocab})"
        if isinstance(self.speculator, TreeSpeculator) or self.runner.choice is not None:
            return tree_step.unsupported(params, self.config.acceptance)
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
        worst = min(self.max_len,
                    len(r.prompt_token_ids) + r.params.max_tokens + 2 * self.num_speculative_tokens + 2)
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
                          warmup: int = 1, seed: int = 0,
                          draft: dict | None = None) -> dict[int, list[float]]:
        """Milliseconds of the decode step of batch_size requests at context_len known tokens for
        each k of ks, over `rounds` rounds after `warmup` untimed ones, without prefill
        (mtpx/auto_k/calibration.py, time_decode_steps). Returns {k: [ms per round]}; draft (when
        given) gets the draft rounds' {k: [ms per round]}. Raises ValueError when the engine has
        requests or cannot hold the batch."""
        if self.has_unfinished_requests():
            raise ValueError("time the decode steps (calibrate the step costs) before adding requests")
        return calibration.time_decode_steps(self.runner, self.kv, self.config, self.model.cfg.vocab_size,
                                             batch_size, ks, context_len, rounds, warmup, seed,
                                             self.scheduler.depth_per_request, draft)

    def calibrate(self, cost_model_file=None, model_path: Path | None = None, draft_path: Path | None = None,
                  spec: str | None = None, device=None, progress=None) -> dict:
        """Automatic k's step costs at start-up (mtpx/auto_k/calibration.py, calibrate): from
        cost_model_file, else (a checkpoint folder, model_path) the step-cost cache
        (store.step_cost_cache_path), else measured now without saving (an in-memory model).
        Returns the calibration's {"source", "seconds", ...}. progress(line): calibrate's progress
        lines. Raises ValueError as calibrate does, and when cost_model_file's folder does not
        exist (a typo: a missing file in an existing folder is written after calibrating)."""
        c, k = self.config, self.num_speculative_tokens
        if cost_model_file is not None and not (folder := Path(cost_model_file).parent).is_dir():
            raise ValueError(f"spec.cost_model_file={cost_model_file}: the folder {folder} does not exist: "
                             "fix the path (a new file in an existing folder is written after calibrating)")
        buckets = {j: j for j in range(k + 1)}
        if self.compiled is not None:     # a compiled step pads a k to its depth bucket
            buckets = {j: depth_bucket(j, k, c.compile_depths) for j in buckets}
        if str(device).startswith("cuda"):
            device_name = torch.cuda.get_device_name()
        else:
            device_name = platform.processor() or platform.machine()
            try:
                with open("/proc/cpuinfo") as f:
                    device_name = next(line.split(":", 1)[1].strip() for line in f
                                       if line.startswith("model name"))
            except (OSError, StopIteration):
                pass
        environment = {"dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
                       "threads": torch.get_num_threads(), "device": str(device), "device_name": device_name,
                       "torch_version": torch.__version__,
                       "compile_depths": depth_buckets(k, c.compile_depths) if c.compile else None}
        meta = store.cost_meta(c, k, model_path, draft_path, spec, environment)
        cached = cost_model_file is None and model_path is not None
        path = store.step_cost_cache_path(meta) if cached else cost_model_file
        return calibration.calibrate(self.scheduler, self.runner, c, self.model.cfg.vocab_size, buckets, path,
                                     meta, cached, progress)

    # ---- compilation ------------------------------------------------------------------------------
    def compile_stats(self) -> dict | None:
        """{"compile_s": seconds spent in calls that built a graph, "num_graphs": graphs built
        (compiled or loaded from the cache), "num_compiled", "num_loaded", "graphs": [{"graph",
        "seconds", "source"}], "regions": compiled layer regions on, "cache_dir", "capture_sizes":
        padded batch sizes (None: unpadded, the CPU), "mode", "backend"}, or None without compile.
        Its graphs are built by mtpx/engine/warmup.py's warm_up (LLM runs it)."""
        c = self.compiled
        if c is None:
            return None
        return {**c.progress.summary(), "regions": self.cache.compile_regions, "cache_dir": c.cache_dir,
                "capture_sizes": c.sizes, "mode": c.mode or "default", "backend": c.backend}


def measure_step_costs(model, spec: str, batch_sizes, num_speculative_tokens: int | None = None,
                       rounds: int = 8, context_len: int = 192, **engine_kwargs) -> list[dict]:
    """The start-up calibration of automatic k (mtpx/auto_k/calibration.py, calibrate_step_costs)
    on a fresh engine over `model` (an MTPForCausalLM) with speculator `spec` ("mtp1" | "mtp8")
    drafting up to num_speculative_tokens (None: the speculator's default), as offline tools use
    it. Returns [{"k", "batch_size", "step_ms"}] for every k in 0 .. that many and each batch size,
    sorted, step_ms the raw median (not smoothed). Raises ValueError as the calibration does."""
    from mtpx.spec_decode import build_speculator

    sizes = sorted(set(batch_sizes))
    speculator = build_speculator(spec, model, num_speculative_tokens)
    k = speculator.num_speculative_tokens
    engine = Engine(model, speculator, max_num_seqs=max(sizes), draft_length=AutoDraftLength(k),
                    **engine_kwargs)
    buckets = {j: j for j in range(k + 1)}
    if engine.compiled is not None:
        buckets = {j: depth_bucket(j, k, engine.config.compile_depths) for j in buckets}
    costs = calibration.calibrate_step_costs(engine.time_decode_steps, k, engine.config.max_num_seqs, buckets,
                                             sizes, rounds=rounds, context_len=context_len)
    return [{"k": k, "batch_size": b, "step_ms": ms} for (k, b), ms in sorted(costs.items())]
