"""The unsharded model's tensors rebuilt from the ranks' shards, one tensor at a time on rank 0
(what a whole-model hash or export reads: mode=distill's target hash)."""
from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.distributed as dist

from mtpx.parallel.shard import Shard


def _local(model, exclude: tuple[str, ...]) -> tuple[dict[str, torch.Tensor], dict[str, tuple]]:
    """This rank's (replicated {name: tensor}, distributed {unsharded name: (Shard or None, tensor)}):
    distributed = sharded, or a whole expert renumbered on the rank (model.tp_plan.sources)."""
    plan, replicated, distributed = model.tp_plan, {}, {}
    for name, t in model.state_dict().items():
        full = plan.source(name)
        if full.startswith(exclude):
            continue
        if name in plan.shards or name in plan.sources:
            distributed[full] = (plan.shards.get(name), t)
        else:
            replicated[full] = t
    return replicated, distributed


def _recv(shape: tuple[int, ...], dtype: torch.dtype, src: int, device, group) -> torch.Tensor:
    """A tensor sent by _send on rank src (as bytes: any dtype, whatever the backend supports)."""
    buf = torch.empty(math.prod(shape) * torch.empty(0, dtype=dtype).element_size(), dtype=torch.uint8,
                      device=device)
    if buf.numel():
        dist.recv(buf, src=src, group=group)
    return buf.view(dtype).view(shape)


def _send(t: torch.Tensor, group) -> None:
    if t.numel():
        dist.send(t.detach().contiguous().view(-1).view(torch.uint8), dst=0, group=group)


def _assemble(name: str, pieces: list[tuple[Shard | None, torch.Tensor]]) -> torch.Tensor:
    """The unsharded tensor from the ranks' (Shard, slice) pieces (a whole expert: (None, it));
    ranks that replicate a slice (a KV head shared by several ranks) write the same values."""
    if pieces[0][0] is None:
        return pieces[0][1]
    dim = pieces[0][0].dim
    size = max(b for s, _ in pieces for _, b in s.ranges)
    shape = list(pieces[0][1].shape)
    shape[dim] = size
    full = torch.empty(shape, dtype=pieces[0][1].dtype, device=pieces[0][1].device)
    covered = torch.zeros(size, dtype=torch.bool)
    for s, t in pieces:
        offset = 0
        for a, b in s.ranges:
            full.narrow(dim, a, b - a).copy_(t.narrow(dim, offset, b - a))
            covered[a:b] = True
            offset += b - a
    if not covered.all():
        raise RuntimeError(f"{name}: the ranks' shards cover {int(covered.sum())} of its {size} "
                           f"rows on dim {dim}")
    return full


def gather_state(model, exclude: tuple[str, ...] = ()) -> Iterator[tuple[str, torch.Tensor]]:
    """The unsharded model's state dict, bit for bit, from a tensor-parallel shard (shard_model's:
    model.tp, model.tp_plan). Collective: every rank of model.tp calls it and iterates it to the
    end. Rank 0 yields (name, tensor) in name order (names starting with one of `exclude` left
    out): its own tensor where replicated, else the tensor rebuilt from every rank's slice on the
    model's device; closing the iterator early still receives the rest. Other ranks yield
    nothing: they send their slices to rank 0. Memory: one unsharded tensor at a time on rank 0.
    Raises what the collectives raise (a dead peer)."""
    tp = model.tp
    group = tp.group                    # None: the default group (ranks are its ranks)
    replicated, distributed = _local(model, tuple(exclude))
    meta = [(n, s, tuple(t.shape), t.dtype) for n, (s, t) in sorted(distributed.items())]
    metas = [None] * tp.world_size if tp.rank == 0 else None
    dist.gather_object(meta, metas, dst=0, group=group)
    if tp.rank != 0:
        for n, _, _, _ in meta:
            _send(distributed[n][1], group)
        return
    holders: dict[str, list[tuple[int, Shard | None, tuple, torch.dtype]]] = {}
    for r, rank_meta in enumerate(metas):
        for n, s, shape, dtype in rank_meta:
            holders.setdefault(n, []).append((r, s, shape, dtype))
    device = next(iter(replicated.values())).device if replicated else "cpu"
    closed = False
    for name in sorted(set(replicated) | set(holders)):
        if name in holders:
            t = _assemble(name,
                          [(s, distributed[name][1] if r == 0 else _recv(shape, dtype, r, device, group))
                           for r, s, shape, dtype in holders[name]])
        else:
            t = replicated[name]
        if not closed:
            try:
                yield name, t
            except GeneratorExit:       # the caller stopped: still receive what the ranks send
                closed = True
