"""A rank's shard of a checkpoint folder, read slice by slice (no rank reads the whole model)."""
from __future__ import annotations

import torch

from mtpx.hf.loader import load_pretrained
from mtpx.parallel.group import TPGroup
from mtpx.parallel.shard import shard_model


def load_shard(path, tp: TPGroup, dtype: torch.dtype = torch.float32, device="cpu", draft_path=None,
               allow_pickle: bool = False):
    """(rank tp.rank's shard of the model in folder `path`, tokenizer): mtpx.hf.loader's
    load_pretrained (mtpx and Hugging Face layouts, the same checks) with every sharded tensor
    read as the rank's slice (safetensors get_slice). Raises what load_pretrained raises, and
    ValueError when the config cannot be split over tp.world_size ranks."""
    return load_pretrained(path, dtype=dtype, device=device, draft_path=draft_path, allow_pickle=allow_pickle,
                           shard=lambda model: shard_model(model, tp))
