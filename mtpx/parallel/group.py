"""The tensor-parallel group of one rank and the collectives the sharded layers call.

Both collectives are torch.distributed's functional collectives, so torch.compile traces them
into its graph; eager, the result is waited for at once (a plain tensor). gloo runs them on the
CPU, NCCL on CUDA (which backend is the process group's: init_process_group's choice).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


@dataclass(frozen=True)
class TPGroup:
    """rank, world_size: this process's place in the tensor-parallel group; group: its
    ProcessGroup (None: the default group, torch.distributed.group.WORLD)."""

    rank: int
    world_size: int
    group: object = None

    @property
    def process_group(self):
        return dist.group.WORLD if self.group is None else self.group


def _done(t: torch.Tensor) -> torch.Tensor:
    if not torch.compiler.is_compiling() and isinstance(t, funcol.AsyncCollectiveTensor):
        return t.wait()
    return t


def all_reduce(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Sum of x over the ranks (same shape and dtype on every rank); x itself is not written."""
    return _done(funcol.all_reduce(x, "sum", tp.process_group))


def all_gather_last(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """x [..., n] of every rank concatenated in rank order on the last dim -> [..., n * world]."""
    return _done(funcol.all_gather_single(x.contiguous(), x.dim() - 1, tp.process_group))
