"""Data-parallel training under torchrun: the process group, DDP / FSDP2 wrapping, each rank's
rows, losses averaged over ranks, and the gathered state that rank 0 checkpoints.

    torchrun --nproc_per_node=N train_or_eval.py mode=train ...   # N ranks, one model replica each

`train.parallel` (auto | none | ddp | fsdp):

- none: one process, no process group (what `python train_or_eval.py mode=train` runs).
- ddp: `torch.nn.parallel.DistributedDataParallel` over the whole model (joint training): every
  rank holds the full weights and optimizer, gradients are averaged by all-reduce in backward.
- fsdp: FSDP2 (`torch.distributed.fsdp.fully_shard`) for `train.freeze_base=true`: each target
  decoder layer is its own unit, sharded over the ranks (all-gathered for its forward, resharded
  after; no gradients); everything else (embedding, final norm, lm_head, the MTP modules) is the
  root unit, gathered for the whole step, and the MTP gradients are reduce-scattered.
- auto: ddp under torchrun with WORLD_SIZE > 1, none otherwise.

The rank, world size and local rank come from torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK; env:// rendezvous via MASTER_ADDR / MASTER_PORT), or from a process group the caller
already initialised (then the caller also destroys it). Backend: gloo on CPU, nccl on CUDA (one
device per rank: cuda:LOCAL_RANK). Every collective is bounded by `train.dist_timeout_s`, so a
rank that died or hangs ends the job with an error instead of a hang.

`train.batch_size` is the GLOBAL batch (rows per optimizer step summed over ranks): rank r trains
rows [r * b, (r + 1) * b) of the single-process batch of the step, b = batch_size / world_size,
so the ranks' rows are disjoint and together are exactly the single-process batch; a run's
hyper-parameters do not change with the world size. Each rank's loss is the mean over its rows
(all ranks have the same token count), so the average over ranks is the global mean and the
averaged gradients are the single-process gradients up to float32 summation order.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

PARALLEL_MODES = ("auto", "none", "ddp", "fsdp")


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: mode "none" | "ddp" | "fsdp", rank, world_size, local_rank,
    and whether it initialised the process group (and so destroys it)."""

    mode: str = "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def active(self) -> bool:
        return self.mode != "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve(parallel: str, freeze_base: bool, batch_size: int, env: dict[str, str] | None = None) -> DistInfo:
    """The parallel mode this process runs, from `train.parallel` and torchrun's environment
    (or an initialised process group). Pure: no process group is created.

    Raises:
        ValueError: unknown mode; none under a world size > 1; ddp/fsdp without torchrun; fsdp
            without freeze_base; batch_size not divisible by the world size.
    """
    env = os.environ if env is None else env
    if parallel not in PARALLEL_MODES:
        raise ValueError(f"train.parallel={parallel!r}: use one of {', '.join(PARALLEL_MODES)}")
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    elif "RANK" in env and "WORLD_SIZE" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    else:
        rank, world = 0, None
    local_rank = int(env.get("LOCAL_RANK", rank))
    if world is None:
        if parallel in ("ddp", "fsdp"):
            raise ValueError(f"train.parallel={parallel} needs torchrun (RANK / WORLD_SIZE are unset): "
                             "launch with torchrun --nproc_per_node=N train_or_eval.py mode=train ..., "
                             "or use train.parallel=auto")
        return DistInfo()
    if parallel == "none" and world > 1:
        raise ValueError(f"train.parallel=none under torchrun with WORLD_SIZE={world}: each rank would train "
                         "alone into the same out_dir; use train.parallel=auto (ddp) or run without torchrun")
    mode = ("ddp" if world > 1 else "none") if parallel == "auto" else parallel
    if mode == "fsdp" and not freeze_base:
        raise ValueError("train.parallel=fsdp shards a frozen target: set train.freeze_base=true, or use "
                         "train.parallel=ddp for joint training")
    if batch_size % world:
        raise ValueError(f"train.batch_size={batch_size} is the global batch (rows per step over all ranks) "
                         f"and must be divisible by the world size {world}: use a multiple of {world}")
    if mode == "none":
        return DistInfo()
    return DistInfo(mode, rank, world, local_rank)


def init(info: DistInfo, device: str, timeout_s: float) -> tuple[DistInfo, torch.device]:
    """Initialise the process group for `info` (unless one exists) with a `timeout_s` bound on
    every collective. Returns (info with owns_group set, this rank's device: cpu, or
    cuda:local_rank for device "cuda")."""
    dev = torch.device(device)
    if dev.type == "cuda" and info.active:
        dev = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(dev)
    if not info.active or dist.is_initialized():
        return info, dev
    backend = "nccl" if dev.type == "cuda" else "gloo"
    kwargs = {"device_id": dev} if dev.type == "cuda" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=float(timeout_s)), **kwargs)
    return DistInfo(info.mode, info.rank, info.world_size, info.local_rank, owns_group=True), dev


def shutdown(info: DistInfo) -> None:
    """Destroy the process group this process created (after a failure too: the other ranks'
    collectives then fail at once, or at the timeout, and torchrun ends the job)."""
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------
# wrapping


def wrap(objective: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """The module each step calls: `objective` itself (none), DDP around it, or `objective`
    sharded in place by FSDP2 (target decoder layers one unit each, the rest the root unit).
    Call after the frozen parameters have requires_grad=False and before the optimizer is built
    (FSDP2 replaces the parameters by sharded DTensors)."""
    if info.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = objective.model
        return DDP(objective, device_ids=[device.index] if device.type == "cuda" else None,
                   find_unused_parameters=model.cfg.num_experts > 0)  # experts a batch does not route to
    if info.mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(device.type, (info.world_size,))
        for layer in objective.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(objective, mesh=mesh)
        if device.type == "cpu":
            # gloo's reduce-scatter with ReduceOp.AVG summed without dividing in some torch
            # versions (pytorch/pytorch#162338; 2.13 averages): reduce with SUM, FSDP divides
            for m in objective.modules():
                if hasattr(m, "set_force_sum_reduction_for_comms"):
                    m.set_force_sum_reduction_for_comms(True)
        return objective
    return objective


# --------------------------------------------------------------------------------------------------
# data and metrics


def rank_rows(batch: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """This rank's rows of a global batch [B, T]: rows [r * B/W, (r + 1) * B/W)."""
    if not info.active:
        return batch
    b = batch.shape[0] // info.world_size
    return batch[info.rank * b:(info.rank + 1) * b]


def mean_over_ranks(metrics: dict[str, float], info: DistInfo, device: torch.device) -> dict[str, float]:
    """Each value averaged over the ranks (all_reduce SUM in float64 / world size), same keys;
    the identity without a process group. Keys are summed in sorted order (every rank has the
    same keys)."""
    if not info.active:
        return metrics
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return {k: float(v) / info.world_size for k, v in zip(keys, t.tolist())}


def any_rank(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every rank if `flag` is true on any (a Ctrl-C seen by one rank stops all of them
    at the same step)."""
    if not info.active:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def on_main(fn: Callable[[], Any], info: DistInfo) -> Any:
    """Run fn() on rank 0 only and hand its result to every rank; an exception on rank 0 is
    raised there and as ValueError(message) on the others, so no rank waits on a failed one."""
    if not info.active:
        return fn()
    box: list[Any] = [None]
    error = None
    if info.is_main:
        try:
            box[0] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
            error = e
            box[0] = ("error", str(e))
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    status, value = box[0]
    if status == "error":
        raise ValueError(value)
    return value


def barrier(info: DistInfo) -> None:
    if info.active:
        dist.barrier()


# --------------------------------------------------------------------------------------------------
# gathered state for rank 0's checkpoint


def full_state(wrapped: nn.Module, objective: nn.Module, optimizer: torch.optim.Optimizer,
               info: DistInfo) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
    """(model state dict, optimizer state dict) in the single-process format (the MTPForCausalLM's
    own names; optimizer.state_dict()'s integer parameter indices), complete on rank 0 and None
    on the other ranks. ddp: every rank holds the full state already, nothing is gathered. fsdp:
    a collective (every rank must call it): `torch.distributed.checkpoint.state_dict`'s
    get_model_state_dict / get_optimizer_state_dict with full_state_dict=True, cpu_offload=True
    gather the shards on rank 0's CPU. none: (None, None), the caller saves the live model."""
    if info.mode != "fsdp":
        return None, None
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(objective, options=opts)
    osd = get_optimizer_state_dict(objective, optimizer, options=opts)
    if not info.is_main:
        return None, None
    prefix = "model."
    model_state = {k[len(prefix):]: v for k, v in msd.items()}
    return model_state, _indexed_optimizer_state(osd, _param_fqns(objective, optimizer))


def load_optimizer_full(objective: nn.Module, optimizer: torch.optim.Optimizer,
                        state: dict[str, Any]) -> None:
    """Load a full optimizer state in the single-process format (integer indices, as
    mtpx.train.checkpoint reads it) into the optimizer of an FSDP2-sharded `objective`: every rank
    passes the full state and keeps its shard (set_optimizer_state_dict, full_state_dict=True)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    fqns = _param_fqns(objective, optimizer)
    by_fqn = {"state": {fqns[i]: st for i, st in state["state"].items()},
              "param_groups": [{**g, "params": [fqns[i] for i in g["params"]]}
                               for g in state["param_groups"]]}
    # strict=False: a parameter without state (no step yet) is left without, as optimizer.load_state_dict does
    set_optimizer_state_dict(objective, optimizer, by_fqn,
                             options=StateDictOptions(full_state_dict=True, strict=False))


def _param_fqns(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Name (in `module`) of each optimizer parameter, in optimizer.state_dict() index order."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _indexed_optimizer_state(osd: dict[str, Any], fqns: Iterable[str]) -> dict[str, Any]:
    """get_optimizer_state_dict's FQN-keyed state -> optimizer.state_dict()'s integer-indexed one."""
    index = {n: i for i, n in enumerate(fqns)}
    return {"state": {index[n]: st for n, st in osd["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]}
