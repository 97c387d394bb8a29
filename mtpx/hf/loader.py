"""Checkpoint folders, read: the one owner of folder checks, config reading, tokenizer loading
and safetensors opening, and `load_pretrained`, which loads a Hugging Face-format folder (or an
mtpx one) into `MTPForCausalLM`. Writing mtpx checkpoints with trainer state is
mtpx.train.checkpoint's; layouts and config translation are mtpx.hf.layout's and .config's; which
tensor feeds which parameter, checked against config.json, is mtpx.hf.tensor_plan's.

    folder/
      config.json                        Hugging Face (has "architectures") or mtpx ModelConfig
      model.safetensors                  or model-0000i-of-0000n.safetensors + model.safetensors.index.json
      tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json (optional)

The model is built on the meta device and every tensor is read from its memory-mapped shard,
converted to the requested dtype and placed on the device one at a time, so the peak memory is
the model in its final dtype plus one tensor: no float32 copy of a bfloat16 checkpoint is made.

MTP draft modules are read in any of the layouts of `mtpx.hf.layout` (mtpx, Qwen3-Next `mtp.*`,
DeepSeek-V3 `model.layers.{num_hidden_layers + k}`), from the folder or from a separate
safetensors file (`draft_path`), which attaches a head trained in mtpx to a standard model.

Security: weights are read with safetensors only. Pickle files (`pytorch_model.bin`, `*.pt`) are
refused unless `allow_pickle=True`, and then read with `torch.load(weights_only=True)`, which
unpickles tensors and plain containers only. No Python file in the folder is imported
(`auto_map` / `trust_remote_code` do not exist here); chat templates render in jinja2's sandbox.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import safetensors
import torch
import torch.nn as nn

from mtpx.hf.config import config_from_hf
from mtpx.hf.layout import detect_layout, is_mtp
from mtpx.hf.tensor_plan import CheckpointError, check_names, plan_tensors, show_names  # noqa: F401  (API)
from mtpx.hf.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, load_hf_tokenizer, load_tokenizer
from mtpx.models.config import ModelConfig
from mtpx.models.model import MTPForCausalLM

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def load_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of checkpoint folder `path`.

    Raises:
        FileNotFoundError: no folder or no config.json.
        ValueError: config.json is not JSON, or has unknown keys.
    """
    path = require_folder(path)
    file = path / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint folder {path} has no {CONFIG_FILE}: "
                                "point model.path at a folder written by mode=train")
    try:
        d = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is not valid JSON ({err}): re-save the checkpoint") from None
    if not isinstance(d, dict):
        raise ValueError(f"{file} holds a {type(d).__name__}, not a config object: re-save the checkpoint")
    try:
        if "architectures" in d:  # a Hugging Face config.json
            return config_from_hf(d, str(file))
        return ModelConfig.from_dict(d)
    except ValueError as err:
        if str(file) in str(err):
            raise
        raise ValueError(f"{file}: {err}") from None


def load_folder_tokenizer(path: Path, is_hf: bool = False):
    """The tokenizer of checkpoint folder `path`, or None without tokenizer.json: a Hugging Face
    tokenizer (`mtpx.hf.tokenizer.HFTokenizer`) for a Hugging Face folder or any folder with a
    tokenizer_config.json (an mtpx checkpoint trained from a Hugging Face model), else mtpx's own
    (`<|endoftext|>` = 0, `<|pad|>` = 1).

    Raises FileNotFoundError (only slow-tokenizer files) and ValueError (a malformed tokenizer)."""
    if is_hf or (path / TOKENIZER_CONFIG_FILE).is_file():
        if ((path / TOKENIZER_FILE).is_file()
                or any((path / n).is_file() for n in ("tokenizer.model", "vocab.json"))):
            return load_hf_tokenizer(path)  # raises for slow-only tokenizers, naming the fix
        return None
    return load_tokenizer(path / TOKENIZER_FILE) if (path / TOKENIZER_FILE).is_file() else None


def is_hf_folder(path: Path) -> bool:
    try:
        return "architectures" in json.loads((path / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return False


def require_folder(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        return path
    if path.exists():
        raise FileNotFoundError(f"{path} is a file, not a checkpoint folder: point model.path at the folder "
                                f"that holds config.json (here perhaps {path.parent})")
    backups = sorted(path.parent.glob(f".{path.name}.old-*")) if path.parent.is_dir() else []
    if backups:
        raise FileNotFoundError(
            f"checkpoint folder {path} does not exist, but {backups[-1]} does (a save was interrupted "
            f"mid-swap): rename it to {path.name}"
        )
    if looks_like_hub_id(str(path)):
        raise FileNotFoundError(
            f"model.path {str(path)!r} is not a local folder; if it is a Hugging Face hub id: mtpx loads "
            "local checkpoint folders only and downloads nothing, so download it first (e.g. "
            f"`huggingface-cli download {path} --local-dir DIR`) and point model.path at DIR (or at a folder "
            "written by mode=train)")
    raise FileNotFoundError(f"checkpoint folder {path} does not exist: "
                            "point model.path at a folder written by mode=train")


def looks_like_hub_id(name: str) -> bool:
    """"org/name" as a hub id is written: two parts of letters, digits, '-', '_' and '.', not a
    relative path ('./x', '../x')."""
    import re
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", name)) and ".." not in name


CHECKPOINT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                     "float64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                     "BF16": torch.bfloat16, "F64": torch.float64}


def checkpoint_dtype(path: str | os.PathLike) -> torch.dtype:
    """The dtype checkpoint folder `path` stores (vLLM's dtype="auto"): config.json's `dtype` /
    `torch_dtype`, else the first floating-point tensor's in the safetensors headers, else
    float32. Raises FileNotFoundError as load_config does."""
    folder = require_folder(path)
    try:
        d = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        d = {}
    for key in ("dtype", "torch_dtype"):
        name = d.get(key) if isinstance(d, dict) else None
        if isinstance(name, str) and name.removeprefix("torch.") in CHECKPOINT_DTYPES:
            return CHECKPOINT_DTYPES[name.removeprefix("torch.")]
    for f in sorted(folder.glob("*.safetensors")):
        try:
            n = int.from_bytes(f.open("rb").read(8), "little")
            with f.open("rb") as fh:
                fh.seek(8)
                header = json.loads(fh.read(n))
        except (OSError, ValueError):
            continue
        for k, v in header.items():
            if k != "__metadata__" and v.get("dtype") in CHECKPOINT_DTYPES:
                return CHECKPOINT_DTYPES[v["dtype"]]
    return torch.float32


SAFE_INDEX = "model.safetensors.index.json"
SAFE_SINGLE = WEIGHTS_FILE
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.bin", "*.ckpt")


def load_pretrained(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu", draft_path: str | os.PathLike | None = None,
                    allow_pickle: bool = False, shard=None):
    """Load checkpoint folder `path` (module doc) with its MTP modules and tokenizer.

    Args:
        path: a Hugging Face-format folder (Qwen3NextForCausalLM, LlamaForCausalLM,
            Qwen3ForCausalLM) or an mtpx checkpoint folder.
        dtype: dtype of the floating-point weights (e.g. torch.bfloat16), converted per tensor.
        device: where the weights go.
        draft_path: a safetensors file (or a folder holding model.safetensors) with MTP modules in
            any layout; they replace any modules in `path`.
        allow_pickle: read pickle weights with torch.load(weights_only=True) when the folder has
            no safetensors (off by default: pickle files are refused).
        shard: tensor parallelism (mtpx.parallel.shard.shard_model): shard(model) turns the model,
            still on the meta device, into one rank's shard and returns its plan (`shards`:
            {name: Shard}, `source(name)`: the unsharded name); each sharded tensor is then read
            as that slice only (safetensors get_slice), so no rank reads the whole model.

    Returns:
        (model in eval mode, tokenizer or None when the folder has no tokenizer.json). For a
        Hugging Face folder the tokenizer is an `mtpx.hf.tokenizer.HFTokenizer` (chat template).

    Raises:
        FileNotFoundError: no folder, config.json, weights or index-listed shard.
        mtpx.hf.config.UnsupportedConfigError: a model family or setting mtpx does not implement.
        CheckpointError: unreadable (corrupted, truncated) safetensors files, pickle weights
            without allow_pickle, missing or unexpected tensor names (listed), shapes that
            disagree with config.json, a qwen3_next/deepseek head count that disagrees with the
            weights, NaN or Inf in a weight (the tensor is named).
    """
    folder = require_folder(path)
    cfg, is_hf = _read_config(folder)
    _check_eos(cfg, folder, is_hf)
    files = weight_files(folder, allow_pickle)
    shapes, where = _read_headers(files)
    layout, num_modules = detect_layout(shapes, cfg.num_hidden_layers)
    if draft_path is not None:  # the draft file's modules replace the folder's
        shapes, layout, num_modules = _attach_draft(draft_path, cfg, shapes, where, allow_pickle)
    else:
        _check_module_count(cfg, folder, is_hf, num_modules)
    cfg.num_nextn_predict_layers = num_modules
    if layout == "deepseek_v3":
        cfg.mtp_style = "deepseek_v3"
    elif layout == "qwen3_next":
        cfg.mtp_style = "qwen3_next"

    with torch.device("meta"):
        model = MTPForCausalLM(cfg)
    plan, copies = plan_tensors(model, shapes, layout, num_modules, where, folder, cfg, draft_path)
    shards = {}
    if shard is not None:           # checked against the full shapes above, then cut to the rank's
        sp = shard(model)
        shards = sp.shards
        plan = {n: plan[sp.source(n)] for n in model.state_dict(keep_vars=True) if sp.source(n) in plan}
    _load(model, plan, copies, where, dtype, device, shards)
    _finish_ties(model, cfg, layout, num_modules)
    _check_finite(model, plan, where, folder)
    return model.eval(), load_folder_tokenizer(folder, is_hf)


def _attach_draft(draft_path: str | os.PathLike, cfg: ModelConfig, shapes: dict[str, tuple],
                  where: dict[str, Path], allow_pickle: bool) -> tuple[dict[str, tuple], str, int]:
    """The tensor shapes with the folder's MTP modules replaced by the draft file's, and the draft's
    (layout, number of modules); `where` gets the draft tensors' file, cfg the draft's mtp_style.
    Raises FileNotFoundError (no draft file) and CheckpointError (no MTP tensors in it)."""
    shapes = {n: s for n, s in shapes.items() if not is_mtp(n, cfg.num_hidden_layers)}
    dfiles = _draft_files(Path(draft_path), allow_pickle)
    for f in dfiles:
        if not f.is_file():
            raise FileNotFoundError(f"spec.draft_path {f} does not exist: "
                                    "point it at a safetensors file of MTP modules")
    dshapes, dwhere = _read_headers(dfiles)
    layout, num_modules = detect_layout(dshapes, cfg.num_hidden_layers)
    if layout is None:
        raise CheckpointError(f"{draft_path} holds no MTP module tensors (mtp.* or model.layers.N.eh_proj "
                              "...): export one with tools/export_checkpoint.py --layout draft")
    shapes.update(dshapes)
    where.update(dwhere)
    style = _metadata(dfiles[0]).get("mtp_style")
    if style:
        cfg.mtp_style = style
    return shapes, layout, num_modules


def _check_module_count(cfg: ModelConfig, folder: Path, is_hf: bool, num_modules: int) -> None:
    """Raises CheckpointError when config.json's num_nextn_predict_layers disagrees with the
    `num_modules` MTP modules the weights hold (a Hugging Face folder may also declare 0)."""
    if is_hf and cfg.num_nextn_predict_layers not in (0, num_modules):
        raise CheckpointError(
            f"{folder / 'config.json'} declares {cfg.num_nextn_predict_layers} MTP module(s) but the weights "
            f"hold {num_modules}: the MTP weights were dropped (transformers' save_pretrained drops mtp.*); "
            "re-download the checkpoint or attach modules with spec.draft_path")
    if not is_hf and cfg.num_nextn_predict_layers != num_modules:
        raise CheckpointError(
            f"{folder / 'config.json'} declares num_nextn_predict_layers={cfg.num_nextn_predict_layers} but "
            f"the weights hold {num_modules} MTP module(s): config.json and the weights come from different "
            f"saves; set num_nextn_predict_layers to {num_modules} in config.json or re-save the checkpoint")


def _check_finite(model: nn.Module, plan: dict[str, str], where: dict[str, Path], folder: Path) -> None:
    """Raises CheckpointError naming the first floating-point tensor that holds NaN or Inf."""
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            src = where.get(plan.get(name, name), folder)
            raise CheckpointError(f"{src}: tensor {plan.get(name, name)!r} (mtpx {name}) holds NaN or Inf "
                                  "values: the file is corrupted or the training run that wrote it diverged")


def _check_eos(cfg: ModelConfig, folder: Path, is_hf: bool) -> None:
    """Raises CheckpointError when an eos_token_id is not a token id of the vocabulary (an
    integer in [0, vocab_size)): it could never be sampled, so no request would stop at it."""
    eos = cfg.eos_token_id
    for e in [] if eos is None else [eos] if isinstance(eos, int) else list(eos):
        if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < cfg.vocab_size:
            where = "config.json (or generation_config.json)" if is_hf else "config.json"
            raise CheckpointError(f"{folder / CONFIG_FILE}: eos_token_id {e!r} is not a token id of the "
                                  f"vocabulary (0 .. {cfg.vocab_size - 1}): fix eos_token_id in {where}")


def weight_files(folder: Path, allow_pickle: bool = False) -> list[Path]:
    """The weight files of `folder`: the shards its index lists, or model.safetensors; pickle
    files only with `allow_pickle`.

    Raises FileNotFoundError (no weights, a missing shard) and CheckpointError (pickle refused,
    an index entry outside the folder, an unreadable index)."""
    index = folder / SAFE_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{index} is not a safetensors index ({err!r}): download it again") from None
        shards = []
        for name in dict.fromkeys(weight_map.values()):
            shard = (folder / name).resolve()
            if shard.parent != folder.resolve():
                raise CheckpointError(f"{index} lists shard '{name}' outside the checkpoint folder: "
                                      "refusing to read it")
            if not shard.is_file():
                raise FileNotFoundError(f"{index} lists shard {name}, which is missing from {folder}: "
                                        "the download is incomplete")
            shards.append(shard)
        return shards
    if (folder / SAFE_SINGLE).is_file():
        return [folder / SAFE_SINGLE]
    pickles = sorted({p for pat in PICKLE_PATTERNS for p in folder.glob(pat)})
    if pickles and not allow_pickle:
        raise CheckpointError(
            f"{folder} has only pickle weights ({', '.join(p.name for p in pickles)}): mtpx reads "
            "safetensors. Convert them (transformers: from_pretrained(...).save_pretrained(dir, "
            "safe_serialization=True)) or, if you trust the file, "
            "set model.allow_pickle=true to read it with torch.load(weights_only=True)")
    if pickles:
        return [p for p in pickles if not p.name.endswith(".index.json")]
    raise FileNotFoundError(f"{folder} has no weights ({SAFE_SINGLE} or {SAFE_INDEX}): "
                            "point model.path at a checkpoint folder")


def _read_config(folder: Path) -> tuple[ModelConfig, bool]:
    """(ModelConfig, is a Hugging Face folder). For a Hugging Face folder, generation_config.json's
    eos ids join config.json's: transformers' generate() stops on them (Llama 3 lists several)."""
    cfg, is_hf = load_config(folder), is_hf_folder(folder)
    if not is_hf:
        return cfg, False
    gen = folder / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except json.JSONDecodeError as err:
            raise ValueError(f"{gen} is not valid JSON ({err}): download it again or delete it") from None
        ids = ([] if cfg.eos_token_id is None else [cfg.eos_token_id] if isinstance(cfg.eos_token_id, int)
               else list(cfg.eos_token_id))
        for e in [] if eos is None else [eos] if isinstance(eos, int) else eos:
            if e not in ids:
                ids.append(e)
        cfg.eos_token_id = None if not ids else ids[0] if len(ids) == 1 else ids
    return cfg, True


def _read_headers(files: list[Path]) -> tuple[dict[str, tuple], dict[str, Path]]:
    """Tensor names -> shapes and -> file, from the safetensors headers only (or pickle files)."""
    shapes, where = {}, {}
    for f in files:
        if f.suffix != ".safetensors":
            sd = _torch_load(f)
            items = {k: tuple(v.shape) for k, v in sd.items()}
        else:
            with _safe_open(f) as h:
                items = {k: tuple(h.get_slice(k).get_shape()) for k in h.keys()}
        for k, s in items.items():
            if k in where:
                raise CheckpointError(f"tensor {k} is stored in both {where[k].name} and {f.name}: "
                                      "the shards overlap")
            shapes[k], where[k] = s, f
    return shapes, where


def _safe_open(f: Path):
    try:
        return safetensors.safe_open(str(f), framework="pt", device="cpu")
    except (safetensors.SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(
            f"{f} is not a readable safetensors file ({err}): it is corrupted or truncated "
            "(an interrupted download or copy?); download it again") from None


def _metadata(f: Path) -> dict:
    if f.suffix != ".safetensors":
        return {}
    with _safe_open(f) as h:
        return h.metadata() or {}


def _torch_load(f: Path) -> dict:
    try:
        return torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad file for the user
        raise CheckpointError(f"{f} could not be read with torch.load(weights_only=True) ({err}): "
                              "convert it to safetensors") from None


def _draft_files(path: Path, allow_pickle: bool) -> list[Path]:
    if not path.is_dir():
        return [path]
    try:
        return weight_files(path, allow_pickle)
    except FileNotFoundError:
        raise FileNotFoundError(f"spec.draft_path {path} is a folder without {SAFE_SINGLE}: point it at the "
                                "safetensors file of MTP modules "
                                "(tools/export_checkpoint.py --layout draft)") from None


def _load(model: nn.Module, plan: dict[str, str], copies: list[str], where: dict[str, Path],
          dtype: torch.dtype, device, shards: dict | None = None) -> None:
    """Read each planned tensor once, file by file, and set it as the parameter(s) it feeds;
    shards: {parameter name: Shard} of a tensor-parallel rank, whose tensors are read as that
    slice only."""
    shards = shards or {}
    embed = shards.get("model.embed_tokens.weight")
    keys = {(c, shards.get(t)) for t, c in plan.items()} | {(n, embed) for n in copies}
    by_file: dict[Path, list] = {}
    for key in sorted(keys, key=lambda k: (k[0], repr(k[1]))):
        by_file.setdefault(where[key[0]], []).append(key)
    params: dict[tuple, nn.Parameter] = {}
    for f, wanted in by_file.items():
        if f.suffix == ".safetensors":
            with _safe_open(f) as h:
                for n, sh in wanted:
                    params[n, sh] = _convert(_get(h, n, f, sh), dtype, device)
        else:
            sd = _torch_load(f)
            for n, sh in wanted:
                params[n, sh] = _convert(sd[n] if sh is None else sh.take(sd[n]), dtype, device)
    for target, ckpt_name in plan.items():
        _set_param(model, target, params[ckpt_name, shards.get(target)])
    for n in copies:  # DeepSeek's per-module embedding copy must be the target's embedding
        if not torch.equal(params[n, embed], model.model.embed_tokens.weight):
            raise CheckpointError(f"{n} differs from model.embed_tokens.weight: mtpx's MTP modules share the "
                                  "target's embedding; dedicated MTP embeddings are not supported")


def _get(h, name: str, f: Path, shard=None) -> torch.Tensor:
    try:
        return h.get_tensor(name) if shard is None else shard.read(h.get_slice(name))
    except (safetensors.SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{f}: tensor {name} cannot be read ({err}): the file is corrupted; "
                              "download it again") from None


def _convert(t: torch.Tensor, dtype: torch.dtype, device) -> nn.Parameter:
    """An owned copy in `dtype` on `device`. Always a copy: safetensors (0.8+) hands out views of
    the memory-mapped file at offsets only 8-byte aligned, and CPU matmul kernels round
    differently (and run slower) on such tensors than on the allocator's 64-byte aligned ones."""
    t = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype, copy=True)
    return nn.Parameter(t.contiguous())


def _set_param(model: nn.Module, name: str, p: nn.Parameter) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    module._parameters[leaf] = p


def _finish_ties(model: MTPForCausalLM, cfg: ModelConfig, layout, num_modules: int) -> None:
    """Tie what the checkpoint stores once: the lm_head to the embedding (tie_word_embeddings),
    Qwen3-Next's shared MTP tensors across modules (the loader set one Parameter for all), and
    a DeepSeek head that is absent or equal to lm_head. Raises CheckpointError if a parameter is
    still unset."""
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for m in model.mtp:
        if m.head is not None and (m.head.weight.is_meta or torch.equal(m.head.weight, model.lm_head.weight)):
            m.head.weight = model.lm_head.weight
    left = [n for n, p in model.named_parameters(remove_duplicate=False) if p.is_meta]
    if left:
        raise CheckpointError(f"parameters {left[:10]} were not loaded: the checkpoint is incomplete")
