"""Checkpoints: one folder per model, written atomically, read back with named, checked errors.

    ckpt/
      config.json            ModelConfig.to_dict()
      model.safetensors      weights (float32 or a chosen dtype); HF Qwen3-Next names; a tied
                             lm_head.weight is not stored (it is model.embed_tokens.weight)
      tokenizer.json         HF tokenizers file
      trainer_state.json     only for resuming: step, loss history, run config, and the optimizer's
                             non-tensor state (hyper-parameters, parameter order)
      optimizer.safetensors  only for resuming: AdamW moments as named tensors "state.{i}.{key}"
      (+ any extra files the caller writes, e.g. losses.csv, loss_curve.png)

Atomic write: everything goes into a hidden sibling folder ".{name}.tmp-XXXX" first. Only when it
is complete is the previous folder moved aside (".{name}.old-XXXX"), the new one renamed into
place, and the old one deleted. A crash leaves either the previous checkpoint or the new one under
the final name; if it strikes between the two renames, `load_*` errors point at the ".old" folder.

Weights are only ever read with safetensors (no pickle, no torch.load).
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch  # called as safetensors.torch.save_file so tests can monkeypatch it
import torch
from tokenizers import Tokenizer

from mtpx.hf.loader import (CONFIG_FILE, WEIGHTS_FILE, CheckpointError, check_names,  # noqa: F401
                            is_hf_folder, load_config, load_folder_tokenizer, load_pretrained,
                            require_folder)
from mtpx.hf.tokenizer import TOKENIZER_FILE, write_tokenizer_config
from mtpx.io import atomic_write_folder, atomic_write_json
from mtpx.models.config import ModelConfig
from mtpx.models.model import MTPForCausalLM
from mtpx.train.tokenizer import save_tokenizer

TRAINER_STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"


# --------------------------------------------------------------------------------------------------
# saving


def save_checkpoint(
    path: str | os.PathLike,
    model: MTPForCausalLM,
    tokenizer: Tokenizer,
    optimizer: torch.optim.Optimizer | None = None,
    trainer_state: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    extra_files: Callable[[Path], None] | None = None,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint folder at `path` atomically, replacing any previous one.

    Args:
        path: the checkpoint folder (created; its parent too).
        model: an MTPForCausalLM; its `cfg` goes to config.json.
        tokenizer: saved as tokenizer.json.
        optimizer: if given, its state goes to optimizer.safetensors (tensors, dtype kept) and
            trainer_state.json["optimizer"] (the rest). Parameter indices follow the optimizer's
            param_groups order, so resume must build the optimizer the same way.
        trainer_state: JSON-serializable dict (step, loss_history, config, ...) for trainer_state.json.
        dtype: floating dtype of the saved weights (e.g. torch.bfloat16 to halve the size).
        extra_files: called with the temporary folder before it is renamed into place, to add files
            that must stay consistent with the checkpoint (loss CSV, plots).
        model_state: the weights to write instead of model.state_dict() (same names): the full
            state gathered from a sharded model (mtpx.train.distributed.full_state); `model` still
            gives the config and which names alias which.
        optimizer_state: a state in optimizer.state_dict()'s format to write instead of
            optimizer.state_dict() (gathered from shards); `optimizer` must be given too.

    Returns:
        `path` as a Path.

    Raises:
        TypeError: trainer_state or the optimizer's hyper-parameters are not JSON-serializable.
        OSError (and anything `extra_files` raises): the previous checkpoint at `path` is untouched
            and the temporary folder is removed.
    """
    def write(tmp: Path) -> None:
        (tmp / CONFIG_FILE).write_text(json.dumps(_model_cfg(model).to_dict(), indent=2) + "\n")
        tensors = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
                   for k, v in _stored_state(model, model_state).items()}
        safetensors.torch.save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if hasattr(tokenizer, "backend_tokenizer"):  # a Hugging Face model's tokenizer (mtpx.hf.tokenizer)
            tokenizer.save(tmp)
        else:
            save_tokenizer(tokenizer, tmp / TOKENIZER_FILE)
            write_tokenizer_config(tmp, tokenizer)    # AutoTokenizer loads the folder as this tokenizer
        state = dict(trainer_state or {})
        if optimizer is not None:
            opt_tensors, state["optimizer"] = _flatten_optimizer(optimizer, optimizer_state)
            safetensors.torch.save_file(opt_tensors, str(tmp / OPTIMIZER_FILE), metadata={"format": "pt"})
        if trainer_state is not None or optimizer is not None:
            atomic_write_json(tmp / TRAINER_STATE_FILE, state)
        if extra_files is not None:
            extra_files(tmp)

    return atomic_write_folder(path, write)


def _model_cfg(model: torch.nn.Module) -> ModelConfig:
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"{type(model).__name__} has no .cfg ModelConfig: pass an mtpx MTPForCausalLM")
    return cfg


def _stored_state(model: torch.nn.Module,
                  state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The tensors that go into model.safetensors: the state dict (or `state`, same names) minus
    aliases.

    A tied lm_head.weight is dropped (it is model.embed_tokens.weight). Any other name whose
    Parameter is an earlier name's is dropped too (safetensors refuses shared tensors, and loading
    the first name restores both), except a tensor shared between draft modules
    (train.mtp_share_fc): it is stored once per module, as a copy, so that the folder loads as
    independent modules with equal weights (what a fresh MTPForCausalLM has names for).
    Aliases are read from the live model's Parameters (`state_dict(keep_vars=True)`), which also
    works when its parameters are FSDP2 shards.
    """
    live = model.state_dict(keep_vars=True)
    sd = state if state is not None else model.state_dict()
    owner: dict[int, str] = {}
    out = {}
    for name, t in live.items():
        first = owner.setdefault(id(t), name)
        if first == name:
            out[name] = sd[name]
        elif first.startswith("mtp.") and name.startswith("mtp."):
            out[name] = sd[name].detach().clone()
    # names the live model lacks: a head-training model without the target's layers saves them
    # from model.path (mtpx/train/shard_training.py)
    out.update({k: v for k, v in sd.items() if k not in live})
    if _model_cfg(model).tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def _flatten_optimizer(optimizer: torch.optim.Optimizer,
                       sd: dict[str, Any] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split optimizer.state_dict() (or `sd`, in its format) into named tensors
    {"state.{i}.{key}": tensor} and a JSON part {"param_groups": [...], "state_scalars":
    {"{i}": {key: value}}} (non-tensor per-param entries)."""
    sd = optimizer.state_dict() if sd is None else sd
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for i, st in sd["state"].items():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"state.{i}.{key}"] = v.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(i), {})[key] = v
    return tensors, {"param_groups": sd["param_groups"], "state_scalars": scalars}


# --------------------------------------------------------------------------------------------------
# loading


def load_model(
    path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[MTPForCausalLM, Tokenizer]:
    """Load a checkpoint folder written by `save_checkpoint`.

    Args:
        path: the checkpoint folder.
        dtype: floating dtype of the returned model's parameters.
        device: where the model is placed.

    Returns:
        (model in eval mode, tokenizer).

    A Hugging Face-format folder (config.json with "architectures") is read by
    `mtpx.hf.loader.load_pretrained` instead, so training can start from a Llama, Qwen3 or
    Qwen3-Next checkpoint (e.g. `train.freeze_base=true` to train MTP heads for it).

    Raises:
        FileNotFoundError: the folder, config.json, model.safetensors or tokenizer.json is missing.
        ValueError: config.json has keys ModelConfig does not know (from ModelConfig.from_dict).
        CheckpointError: tensor names missing from / unexpected in model.safetensors (both listed,
            up to 10 names each, with counts), or a tensor whose shape disagrees with config.json.
    """
    path = require_folder(path)
    if is_hf_folder(path):
        model, tokenizer = load_pretrained(path, dtype=dtype, device=device)
        if tokenizer is None:
            raise FileNotFoundError(f"checkpoint folder {path} has no {TOKENIZER_FILE}: "
                                    "add the model's tokenizer.json")
        return model, tokenizer
    cfg = load_config(path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(
            f"checkpoint folder {path} has no {WEIGHTS_FILE}: the save did not finish; "
            "re-run mode=train or point model.path elsewhere"
        )
    if not (path / TOKENIZER_FILE).is_file():
        raise FileNotFoundError(f"checkpoint folder {path} has no {TOKENIZER_FILE}: "
                                "point model.path at a folder written by mode=train")
    tokenizer = load_folder_tokenizer(path)

    model = MTPForCausalLM(cfg)
    expected = {k: tuple(v.shape) for k, v in _stored_state(model).items()}
    tensors = {}
    with safetensors.safe_open(str(weights), framework="pt", device="cpu") as f:
        stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        check_names(weights, expected, stored)
        for name, shape in expected.items():
            if stored[name] != shape:
                raise CheckpointError(
                    f"{weights}: tensor {name} has shape {list(stored[name])} but config.json implies "
                    f"{list(shape)}: config.json and weights come from different models; "
                    "re-save the checkpoint"
                )
        for name in expected:
            tensors[name] = f.get_tensor(name)
    # strict=False only because aliases (tied lm_head) are absent from the file; names were checked above
    model.load_state_dict(tensors, strict=False)
    model.to(device=device, dtype=dtype)
    return model.eval(), tokenizer


def has_trainer_state(path: str | os.PathLike) -> bool:
    """True if `path` is a checkpoint folder that can be resumed (holds trainer_state.json)."""
    return (Path(path) / TRAINER_STATE_FILE).is_file()


def load_trainer_state(path: str | os.PathLike) -> dict[str, Any]:
    """The trainer_state.json dict of checkpoint folder `path` (step, loss_history, config,
    optimizer meta, ...).

    Raises:
        FileNotFoundError: no folder or no trainer_state.json (a weights-only checkpoint).
    """
    path = require_folder(path)
    file = path / TRAINER_STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"checkpoint folder {path} has no {TRAINER_STATE_FILE}: it holds weights only; "
            "use it as model.path for a fresh run instead of resuming"
        )
    return json.loads(file.read_text())


def load_optimizer_state(path: str | os.PathLike, optimizer: torch.optim.Optimizer) -> None:
    """Restore `optimizer` (built over the same parameters, in the same order) from checkpoint `path`.

    Raises:
        FileNotFoundError: no trainer_state.json or optimizer.safetensors.
        CheckpointError: the saved state was made for a different number of parameters per group.
    """
    optimizer.load_state_dict(read_optimizer_state(path, optimizer))


def read_optimizer_state(path: str | os.PathLike, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state saved in checkpoint `path`, in optimizer.state_dict()'s format (full
    tensors on the CPU), checked against `optimizer`'s parameter groups; `load_optimizer_state`
    loads it, a sharded run hands it to mtpx.train.distributed.load_optimizer_full.

    Raises:
        FileNotFoundError, CheckpointError: as load_optimizer_state.
    """
    path = require_folder(path)
    meta = load_trainer_state(path).get("optimizer")
    file = path / OPTIMIZER_FILE
    if meta is None or not file.is_file():
        raise FileNotFoundError(
            f"checkpoint folder {path} has no optimizer state ({OPTIMIZER_FILE}): "
            "set train.resume=false to start over"
        )
    saved_sizes = [len(g["params"]) for g in meta["param_groups"]]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if saved_sizes != sizes:
        raise CheckpointError(
            f"{file}: optimizer was saved with {saved_sizes} parameters per group, this one has {sizes}: "
            "resume with the same model and train.freeze_base setting, or set train.resume=false"
        )
    state: dict[int, dict[str, Any]] = {}
    with safetensors.safe_open(str(file), framework="pt", device="cpu") as f:
        for name in f.keys():
            _, i, key = name.split(".", 2)
            state.setdefault(int(i), {})[key] = f.get_tensor(name)
    for i, st in meta.get("state_scalars", {}).items():
        state.setdefault(int(i), {}).update(st)
    return {"state": state, "param_groups": meta["param_groups"]}
