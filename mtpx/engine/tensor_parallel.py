"""The engine side of tensor parallelism (docs/tensor_parallel.md; sharding and processes are
mtpx.parallel's).

Every rank holds a shard of the model and runs the same ModelRunner calls on it (SPMD): rank 0
owns the scheduler, the requests and the client side; `TensorParallelRunner` stands in for its
ModelRunner, broadcasting each call (the step's SchedulerOutput, with lean copies of its
requests) to the workers before running it locally. Every rank then computes the same step:
the sharded forwards end in an all-reduce or an all-gather, so hidden states and logits are the
same tensors on every rank, greedy argmaxes agree, and a sampled request's torch.Generator
travels pickled with the request, so every rank draws the same uniforms (same seeds, same
state). Only rank 0's RunnerOutput is used. Batch slots freed on rank 0 (finished, aborted,
preempted requests) are freed on the workers before their next call, in the same order.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.distributed as dist

from mtpx.engine.engine import Engine
from mtpx.engine.scheduler import SchedulerOutput
from mtpx.parallel import TPGroup, check_shardable
from mtpx.parallel.load import load_shard
from mtpx.parallel.spmd import Driver, TensorParallelError, init_group, serve, start_workers, under_torchrun

__all__ = ["TensorParallelRunner", "TensorParallelError", "start", "worker_main"]


def _lean(r):
    """A copy of request r with what the model runner reads (tokens, params, generator, drafts,
    depth, stop ids), without the client's state (stop-string checker, logprobs, times)."""
    return dataclasses.replace(r, stop_strings=None, logprobs=[], prompt_logprobs={}, logit_gaps=[],
                               emission_times=[])


def lean_output(out: SchedulerOutput) -> SchedulerOutput:
    """The SchedulerOutput the workers receive: the same items over lean request copies (one copy
    per request, shared where the output names a request twice)."""
    copies: dict[int, object] = {}

    def lean(r):
        if id(r) not in copies:
            copies[id(r)] = _lean(r)
        return copies[id(r)]

    return SchedulerOutput(
        prefills=[dataclasses.replace(p, request=lean(p.request)) for p in out.prefills],
        decodes=[dataclasses.replace(d, request=lean(d.request)) for d in out.decodes],
        preempted=[lean(r) for r in out.preempted], num_speculative_tokens=out.num_speculative_tokens,
        lowered_depths=[lean(r) for r in out.lowered_depths])


class TensorParallelRunner:
    """Rank 0's model runner (module doc): execute, release and time_decode_steps reach every
    rank; anything else (cache, compiled, speculator, ...) is rank 0's ModelRunner's. A failed
    collective or a dead worker raises TensorParallelError (one line naming the worker)."""

    def __init__(self, runner, driver: Driver):
        self._runner, self.driver = runner, driver
        self._released: list[int] = []
        self.driver.broadcast("set_num_threads", torch.get_num_threads())

    def __getattr__(self, name):
        return getattr(self._runner, name)

    @property
    def tensor_parallel_size(self) -> int:
        return self.driver.tp.world_size

    def _run(self, fn, *args):
        try:
            return fn(*args)
        except TensorParallelError:
            raise
        except Exception as err:  # a collective failed: a worker died or hung
            if isinstance(err, dist.DistError) or any(not p.is_alive() for p in self.driver.procs or []):
                raise self.driver.failure(err) from None
            raise

    def execute(self, out: SchedulerOutput):
        released, self._released = self._released, []
        self.driver.broadcast("execute", released, lean_output(out))
        return self._run(self._runner.execute, out)

    def release(self, index: int) -> None:
        self._runner.release(index)
        self._released.append(index)

    def time_decode_steps(self, reqs, block_tables, ks, rounds, warmup, depth_per_request):
        released, self._released = self._released, []
        self.driver.broadcast("time_decode_steps", released, [_lean(r) for r in reqs], block_tables, list(ks),
                              rounds, warmup, depth_per_request)
        return self._run(self._runner.time_decode_steps, reqs, block_tables, ks, rounds, warmup,
                         depth_per_request)

    def close(self) -> None:
        self.driver.close()


class _Worker:
    """What a worker runs for each broadcast call (TensorParallelRunner's counterparts)."""

    def __init__(self, runner):
        self.runner = runner

    def set_num_threads(self, n: int) -> None:
        torch.set_num_threads(n)

    def execute(self, released: list[int], out: SchedulerOutput) -> None:
        for i in released:
            self.runner.release(i)
        self.runner.execute(out)

    def time_decode_steps(self, released, reqs, block_tables, ks, rounds, warmup, depth_per_request) -> None:
        for i in released:
            self.runner.release(i)
        self.runner.time_decode_steps(reqs, block_tables, ks, rounds, warmup, depth_per_request)


def build_engine(tp: TPGroup, build: dict):
    """(model shard, tokenizer, speculator, draft-length policy, Engine) of rank tp.rank, as LLM
    builds them: build holds path, dtype, draft_path, allow_pickle, device, spec,
    num_speculative_tokens, auto and config (the resolved EngineConfig)."""
    from mtpx.engine.draft_length import AutoDraftLength
    from mtpx.spec_decode import build_speculator
    model, tokenizer = load_shard(build["path"], tp, build["dtype"], build["device"], build["draft_path"],
                                  build["allow_pickle"])
    model.eval()
    speculator = build_speculator(build["spec"], model, build["num_speculative_tokens"])
    policy = AutoDraftLength(speculator.num_speculative_tokens) if build["auto"] else None
    return model, tokenizer, speculator, policy, Engine(model, speculator, build["config"], draft_length=policy)


def worker_main(rank: int, world_size: int, port: int | None, build: dict) -> None:
    """A worker process (spawned by `start`, or a torchrun rank > 0): join the group, build the
    rank's engine, run the broadcast calls until shutdown."""
    torch.set_num_threads(build["threads"])
    tp = init_group(rank, world_size, port, build["device"])
    try:
        runner = build_engine(tp, build)[4].runner
    except Exception as err:  # noqa: BLE001 - one line, then exit: rank 0 reports the dead worker
        print(f"mtpx tensor-parallel worker rank {rank}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    serve(_Worker(runner), tp)


def start(build: dict) -> Driver:
    """Start the engine's other ranks (module doc of mtpx.parallel.spmd) for
    build["config"].tensor_parallel_size N and join them as rank 0: spawned worker processes,
    or, under torchrun with WORLD_SIZE = N, the other torchrun processes (on a rank > 0 this
    runs the worker and exits the process when rank 0 shuts down). Raises ValueError (one line)
    for a model that is not a checkpoint folder, a config that cannot be split, or a torchrun
    world of another size."""
    from mtpx.hf.loader import load_config
    N = build["config"].tensor_parallel_size
    if not isinstance(build["path"], (str, os.PathLike)):
        raise ValueError(f"engine.tensor_parallel_size={N} needs a checkpoint folder (model=PATH): each rank reads "
                         "its own shard of it; an in-memory model cannot be split across processes")
    check_shardable(load_config(build["path"]), N)
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != N:
            raise ValueError(f"engine.tensor_parallel_size={N} but torchrun started {world} processes: "
                             f"run torchrun --nproc_per_node={N}")
        rank = int(os.environ["RANK"])
        if rank != 0:
            worker_main(rank, N, None, build)
            sys.exit(0)
        return Driver(init_group(0, N, None, build["device"]))
    procs, port = start_workers("mtpx.engine.tensor_parallel:worker_main", N, (build,))
    return Driver(init_group(0, N, port, build["device"]), procs)
