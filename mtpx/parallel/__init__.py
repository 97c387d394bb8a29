"""Tensor-parallel inference (Megatron-LM's layout, gpt-fast's tp.py in spirit): weights sharded
by heads / channels / experts / vocabulary across the ranks of a torch.distributed process group,
functional collectives (torch.distributed._functional_collectives, traceable by torch.compile)
where a sharded product is summed or gathered. docs/tensor_parallel.md is the user's page.

- group: the rank's TPGroup and its two collectives (all-reduce, all-gather on the last dim).
- layers: the sharded modules (row-parallel linear, vocab-parallel embedding and lm_head, MoE
  with experts split across ranks).
- shard: which slice of every parameter a rank holds (ShardPlan) and shard_model, which turns an
  MTPForCausalLM (loaded, or on the meta device) into the rank's shard.
- gather: the unsharded model's tensors rebuilt on rank 0 from the ranks' shards (gather_state).
- spmd: the driver's proxy (rank 0 broadcasts each runner call) and the workers' loop.
"""
from mtpx.parallel.gather import gather_state
from mtpx.parallel.group import TPGroup, all_gather_last, all_reduce
from mtpx.parallel.shard import Shard, ShardPlan, check_shardable, shard_model

__all__ = ["gather_state", "TPGroup", "all_gather_last", "all_reduce", "Shard", "ShardPlan",
           "check_shardable", "shard_model"]
