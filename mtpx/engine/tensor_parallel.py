"""The engine side of tensor parallelism (docs/tensor_parallel.md; sharding and processes are
mtpx.parallel's).

Every rank holds a shard of the model and runs the same ModelRunner calls on it (SPMD): rank 0
owns the scheduler, the requests and the client side; its Engine builds a `TensorParallelRunner`,
a ModelRunner that broadcasts each call (the step's SchedulerOutput, with lean copies of its
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
from typing import Iterator

import torch
import torch.distributed as dist

from mtpx.core.scheduler import SchedulerOutput
from mtpx.engine.model_runner import ModelRunner
from mtpx.parallel import check_shardable, gather_state
from mtpx.parallel.load import load_shard
from mtpx.parallel.spmd import Driver, TensorParallelError, init_group, serve, start_workers, under_torchrun
from mtpx.spec_decode import SPECULATORS

__all__ = ["TensorParallelRunner", "TensorParallelError", "build_engine", "full_state", "start",
           "worker_main"]


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
        preempted=[lean(r) for r in out.preempted], num_speculative_tokens=out.num_speculative_tokens)


class TensorParallelRunner(ModelRunner):
    """Rank 0's model runner (module doc), the one Engine builds when the model is rank 0's shard
    of a tensor-parallel model (its `tp_driver`): execute, release and decode reach
    every rank; everything else is ModelRunner's, on rank 0's shard. A failed collective or a
    dead worker raises TensorParallelError (one line naming the worker).

    The workers build their engine `engine_id` here (build_engine on their model shard with the
    same spec, num_speculative_tokens, auto and config), so several engines (LLMs) over one
    model share the workers: mode=eval's lossless check decodes with a plain engine beside the
    speculative one."""

    def __init__(self, model, speculator, config, max_len: int, driver: Driver, auto: bool):
        super().__init__(model, speculator, config, max_len)
        self.driver = driver
        self.engine_id = driver.new_id()
        self._released: list[int] = []
        self._in_call = False
        spec = next((name for name, cls in SPECULATORS.items() if isinstance(speculator, cls)), None)
        k = None if speculator is None else speculator.num_speculative_tokens
        self.driver.broadcast("set_num_threads", torch.get_num_threads())
        self.driver.broadcast("build", self.engine_id, spec, k, auto, config)

    @property
    def tensor_parallel_size(self) -> int:
        return self.driver.tp.world_size

    def _run(self, fn, *args):
        """fn(*args), ModelRunner's call that every worker runs too (its own releases included)."""
        self._in_call = True
        try:
            return fn(*args)
        except TensorParallelError:
            raise
        except Exception as err:  # a collective failed: a worker died or hung
            if isinstance(err, dist.DistError) or any(not p.is_alive() for p in self.driver.procs or []):
                raise self.driver.failure(err) from None
            raise
        finally:
            self._in_call = False

    def _released_now(self) -> list[int]:
        released, self._released = self._released, []
        return released

    def execute(self, out: SchedulerOutput):
        self.driver.broadcast("execute", self.engine_id, self._released_now(), lean_output(out))
        return self._run(super().execute, out)

    def release(self, index: int) -> None:
        """Free the slot here, and on the workers before their next call; a slot that a
        broadcast call frees itself (a preempted request's) is freed by that call on every rank."""
        super().release(index)
        if not self._in_call:
            self._released.append(index)

    def decode(self, decodes):
        self.driver.broadcast("decode", self.engine_id, self._released_now(),
                              [dataclasses.replace(d, request=_lean(d.request)) for d in decodes])
        return self._run(super().decode, decodes)

    def drop(self) -> None:
        """Free this engine on the workers (its caches); no-op once the workers are gone."""
        if not self.driver.closed:
            self.driver.broadcast("drop", self.engine_id)


def build_engine(model, spec, num_speculative_tokens, auto: bool, config):
    """(speculator, Engine) over `model` as LLM builds them: build_speculator(spec, model,
    num_speculative_tokens), an AutoDraftLength policy when `auto`, Engine(config)."""
    from mtpx.auto_k import AutoDraftLength
    from mtpx.engine.engine import Engine         # Engine builds TensorParallelRunner: imported here
    from mtpx.spec_decode import build_speculator
    speculator = build_speculator(spec, model, num_speculative_tokens)
    policy = AutoDraftLength(speculator.num_speculative_tokens) if auto else None
    return speculator, Engine(model, speculator, config, draft_length=policy)


class _Worker:
    """What a worker runs for each broadcast call: its model shard and one ModelRunner per engine
    rank 0 built (TensorParallelRunner's counterparts)."""

    def __init__(self, model):
        self.model, self.runners = model, {}

    def set_num_threads(self, n: int) -> None:
        torch.set_num_threads(n)

    def build(self, engine_id: int, spec, num_speculative_tokens, auto: bool, config) -> None:
        engine = build_engine(self.model, spec, num_speculative_tokens, auto, config)[1]
        self.runners[engine_id] = engine.runner

    def drop(self, engine_id: int) -> None:
        self.runners.pop(engine_id, None)

    def execute(self, engine_id: int, released: list[int], out: SchedulerOutput) -> None:
        runner = self.runners[engine_id]
        for i in released:
            runner.release(i)
        runner.execute(out)

    def decode(self, engine_id: int, released, decodes) -> None:
        runner = self.runners[engine_id]
        for i in released:
            runner.release(i)
        runner.decode(decodes)

    def gather_state(self, exclude: tuple[str, ...]) -> None:
        for _ in gather_state(self.model, exclude):        # sends this rank's slices to rank 0
            pass


def full_state(model, exclude: tuple[str, ...] = ()) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the whole model's state dict in name order, names starting with one of
    `exclude` left out: a model in one process's, or, for rank 0's shard of a tensor-parallel
    LLM (model.tp_driver), the unsharded tensors rebuilt from every rank's slices, one at a time
    (mtpx.parallel.gather; equal bit for bit to the unsharded model's). Iterate it to the end.
    Raises TensorParallelError when a worker dies meanwhile."""
    driver = getattr(model, "tp_driver", None)
    if driver is None:
        state = model.state_dict()
        yield from ((n, state[n]) for n in sorted(state) if not n.startswith(exclude))
        return
    driver.broadcast("gather_state", tuple(exclude))
    try:
        yield from gather_state(model, tuple(exclude))
    except Exception as err:  # a collective failed: a worker died or hung
        if isinstance(err, dist.DistError) or any(not p.is_alive() for p in driver.procs or []):
            raise driver.failure(err) from None
        raise


def worker_main(rank: int, world_size: int, port: int | None, build: dict) -> None:
    """A worker process (started by `start`, or a torchrun rank > 0): join the group, load the
    rank's shard (build: path, dtype, device, draft_path, allow_pickle, threads), then run the
    broadcast calls until shutdown."""
    torch.set_num_threads(build["threads"])
    tp = init_group(rank, world_size, port, build["device"])
    try:
        model, _ = load_shard(build["path"], tp, build["dtype"], build["device"], build["draft_path"],
                              build["allow_pickle"])
    except Exception as err:  # noqa: BLE001 - one line, then exit: rank 0 reports the dead worker
        print(f"mtpx tensor-parallel worker rank {rank}: {type(err).__name__}: {err}", file=sys.stderr,
              flush=True)
        sys.exit(1)
    serve(_Worker(model.eval()), tp)


def start(world_size: int, build: dict) -> Driver:
    """Start the other ranks of a world_size-way tensor-parallel engine (module doc of
    mtpx.parallel.spmd) and join them as rank 0: worker processes started here, or, under
    torchrun with WORLD_SIZE = world_size, the other torchrun processes (on a rank > 0 this
    runs the worker and exits the process when rank 0 shuts down). build: what worker_main
    reads. Raises ValueError (one line) for a config that cannot be split or a torchrun world
    of another size."""
    from mtpx.hf.loader import load_config
    N = world_size
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
