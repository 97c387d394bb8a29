"""Export a model with mtpx-trained MTP modules to a layout that serving engines read. Three
layouts (names in `mtpx.hf.layout`), picked by what the modules compute (`ModelConfig.mtp_style`,
`mtpx.models.mtp`) and what will serve them:

- "qwen3_next": a Hugging Face folder as Qwen/Qwen3-Next ships it, read as vLLM's
  `qwen3_next_mtp.py` reads it: config.json with `mtp_num_hidden_layers` (and
  `num_nextn_predict_layers`, from which vLLM sizes its MTP stack), the target weights,
  `mtp.layers.{k}.*` and ONE `mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`,
  `mtp.norm` for all modules. Needs `mtp_style == "qwen3_next"` and, for several modules, fc and the
  three norms equal across them (the layout has no per-module copies).
- "deepseek_v3": a Hugging Face folder with module k as `model.layers.{num_hidden_layers + k}`
  (`enorm`, `hnorm`, `eh_proj`, `shared_head.norm`, `shared_head.head`, the block) and
  `num_nextn_predict_layers`, as vLLM's `deepseek_mtp.py` reads them. Needs
  `mtp_style == "deepseek_v3"`. `shared_head.head` is written even when it is the target's lm_head,
  and module 0 carries the embedding (`embed_tokens`), as DeepSeek-V3 checkpoints do (vLLM reads only
  the first module's copy).
- "draft": one safetensors FILE of the MTP modules under their mtpx names (`mtp.{k}.*`), metadata
  {"format": "pt", "mtp_style", "num_nextn_predict_layers"}: what `draft_path` (load_pretrained, LLM,
  `spec.draft_path`) attaches to a standard target. Either style, per-module fc and norms kept; a head
  that is the target's lm_head is left out (the loader ties it again).

Target weights keep their names (`model.*`, `lm_head`); a tied lm_head is not stored, as
transformers' `save_pretrained` does. A folder is written into a hidden sibling and renamed into
place once complete (as `save_checkpoint`), a draft file next to its destination and renamed over it.
The source's tokenizer files are copied along (tokenizer.json, tokenizer_config.json,
chat_template.jinja, additional_chat_templates/, generation_config.json, special_tokens_map.json);
for an mtpx source (`<|endoftext|>` = 0, `<|pad|>` = 1) a tokenizer_config.json naming them is
written for transformers' AutoTokenizer. Export then `load_pretrained` in the model's dtype gives the
same parameters bit for bit.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from mtpx.hf.config import config_to_hf
from mtpx.hf.layout import QWEN3_NEXT_SHARED, from_mtpx
from mtpx.hf.loader import _safe_open, load_pretrained, require_folder, weight_files
from mtpx.hf.tokenizer import load_tokenizer, tokenizer_config
from mtpx.io import atomic_write_bytes, atomic_write_folder, atomic_write_json
from mtpx.models.model import MTPForCausalLM

EXPORT_LAYOUTS = ("qwen3_next", "deepseek_v3", "draft")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json", "special_tokens_map.json")
TOKENIZER_DIRS = ("additional_chat_templates",)
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024 ** 3  # transformers' save_pretrained default ("5GB")

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16,
                       "F16": torch.float16}
_MODULE_RE = re.compile(r"^mtp\.(\d+)\.(.+)$")
_MTPX_SPECIAL = {"<|endoftext|>": 0, "<|pad|>": 1}  # mtpx.train.tokenizer's fixed ids


class ExportError(ValueError):
    """The model cannot be written exactly in the requested layout (the message names the fix)."""


# --------------------------------------------------------------------------------------------------
# public API


def export_checkpoint(src: str | os.PathLike, out: str | os.PathLike, layout: str | None, *,
                      num_modules: int | None = None, dtype: torch.dtype | None = None,
                      target_only: bool = False, draft_path: str | os.PathLike | None = None,
                      allow_pickle: bool = False,
                      max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Read checkpoint `src` with `load_pretrained` and write it to `out` in `layout`.

    Args:
        src: any folder `mtpx.hf.loader.load_pretrained` reads (an mtpx checkpoint such as
            checkpoints/demo, or a Hugging Face folder with MTP modules in any layout).
        out: the folder to write ("qwen3_next", "deepseek_v3", target_only), or the .safetensors
            file ("draft"). An existing folder/file there is replaced once the new one is complete.
        layout: "qwen3_next", "deepseek_v3" or "draft" (module doc); None only with target_only.
        num_modules: export MTP modules 0..num_modules-1 (default: all of them).
        dtype: floating dtype of the written tensors (e.g. torch.bfloat16). Default: the source's
            (the widest one when its tensors mix dtypes); the weights are read in that dtype, so
            nothing is rounded.
        target_only: write the target without MTP modules (a plain Hugging Face folder).
        draft_path: MTP modules to attach to `src` first (`load_pretrained`'s draft_path), e.g.
            to turn a target folder plus a draft file into one Qwen3-Next folder.
        allow_pickle: passed to `load_pretrained`.
        max_shard_bytes: split the weights into model-0000i-of-0000n.safetensors shards (with
            model.safetensors.index.json) when they exceed this many bytes.

    Returns:
        `out` as a Path.

    Raises:
        FileNotFoundError, mtpx.hf.loader.CheckpointError,
        mtpx.hf.config.UnsupportedConfigError: from `load_pretrained` (unreadable source).
        ExportError: the layout cannot represent the model (wrong `mtp_style`, Qwen3-Next layout
            with modules whose fc / norms differ), or bad arguments (unknown layout, num_modules
            out of range, out == src, a draft path without the .safetensors suffix).
    """
    src = Path(src)
    _check_args(layout, target_only, Path(out))
    if src.is_dir() and Path(out).resolve() == src.resolve():
        raise ExportError(f"the output {out} is the source folder: write the export to a new path")
    stored = source_dtype(src, allow_pickle, draft_path)
    # read in the wider of the two, so that the final cast is the only rounding
    load_dtype = stored if dtype is None or stored.itemsize > dtype.itemsize else dtype
    model, _ = load_pretrained(src, dtype=load_dtype, draft_path=draft_path, allow_pickle=allow_pickle)
    return export_model(model, out, layout, num_modules=num_modules, dtype=dtype or stored,
                        target_only=target_only, tokenizer_dir=src, max_shard_bytes=max_shard_bytes)


def export_model(model: MTPForCausalLM, out: str | os.PathLike, layout: str | None, *,
                 num_modules: int | None = None, dtype: torch.dtype | None = None,
                 target_only: bool = False, tokenizer_dir: str | os.PathLike | None = None,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Write `model` to `out` in `layout` (module doc), atomically.

    Args:
        model: an MTPForCausalLM (any device; tensors are copied to the CPU).
        out, layout, num_modules, target_only, max_shard_bytes: as `export_checkpoint`.
        dtype: floating dtype of the written tensors; default: the model's parameter dtype.
        tokenizer_dir: a folder whose tokenizer files (module doc) are copied into a folder export;
            None writes no tokenizer. Ignored for "draft".

    Returns:
        `out` as a Path.

    Raises:
        ExportError: as `export_checkpoint`.
        mtpx.hf.config.UnsupportedConfigError: the model's flags match no Hugging Face class
            (`config_to_hf`), for folder layouts.
        OSError: writing failed; whatever was at `out` before is untouched.
    """
    out = Path(out)
    _check_args(layout, target_only, out)
    if dtype is None:
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    tensors = export_tensors(model, layout, num_modules=num_modules, target_only=target_only)
    tensors = _to_storable(tensors, dtype)
    n = 0 if target_only else _num_modules(model, num_modules)
    if layout == "draft":
        metadata = {"format": "pt", "mtp_style": model.cfg.mtp_style, "num_nextn_predict_layers": str(n)}
        atomic_write_bytes(out, safetensors.torch.save(tensors, metadata=metadata))  # a draft file is small
        return out
    cfg = dataclasses.replace(model.cfg, num_nextn_predict_layers=n)
    config = config_to_hf(cfg, layout if n else None)
    config["dtype"] = str(dtype).removeprefix("torch.")

    def write(tmp: Path) -> None:
        atomic_write_json(tmp / "config.json", config)
        _save_weights(tensors, tmp, max_shard_bytes)
        if tokenizer_dir is not None:
            copy_tokenizer_files(Path(tokenizer_dir), tmp)

    atomic_write_folder(out, write)
    return out


def export_tensors(model: MTPForCausalLM, layout: str | None, *, num_modules: int | None = None,
                   target_only: bool = False) -> dict[str, torch.Tensor]:
    """The tensors an export of `model` in `layout` holds, under the layout's names, still
    aliasing the model's parameters (same dtype and device; shared tensors appear once per
    name: `_to_storable` copies them apart).

    Folder layouts: target tensors (without a tied lm_head) plus modules 0..N-1; "draft": the
    modules only. Raises ExportError (module doc: `check_exportable`, argument errors).
    """
    cfg = model.cfg
    n = 0 if target_only else _num_modules(model, num_modules)
    if layout == "draft" and n == 0:
        raise ExportError("a draft file holds MTP modules, but this export has none (the model has "
                          f"{len(model.mtp)}; num_modules={num_modules}): export at least one module")
    if n:
        check_exportable(model, layout, n)
    L = cfg.num_hidden_layers
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict(keep_vars=False).items():
        m = _MODULE_RE.match(name)
        if m is None:
            if layout == "draft" or (name == "lm_head.weight" and cfg.tie_word_embeddings):
                continue
            out[name] = t
            continue
        k, rest = int(m[1]), m[2]
        if k >= n:
            continue
        if layout == "draft":
            if rest == "head.weight" and _same_tensor(t, model.lm_head.weight):
                continue  # tied to the target's lm_head: the loader ties it again
            out[name] = t
            continue
        new = from_mtpx(name, layout, L)
        if new is not None:  # None: a Qwen3-Next shared tensor of module k > 0 (checked equal)
            out[new] = t
    if layout == "deepseek_v3" and n:
        out[f"model.layers.{L}.embed_tokens.weight"] = model.model.embed_tokens.weight.detach()
    return out


def check_exportable(model: MTPForCausalLM, layout: str | None, num_modules: int) -> None:
    """Check that MTP modules 0..num_modules-1 of `model` can be written in `layout` with nothing
    lost: the weights each module runs with and what it hands on and takes logits from.
    (vLLM's deepseek_mtp.py also zeroes the embedding input at position 0,
    `inputs_embeds[positions == 0] = 0`, which mtpx's modules do not: a difference in the forward
    pass, not in the weights.)

    Raises:
        ExportError: "qwen3_next" with mtp_style "deepseek_v3", or with modules whose fc /
            pre_fc_norm_embedding / pre_fc_norm_hidden / norm differ (torch.equal) from module 0's;
            "deepseek_v3" with mtp_style "qwen3_next". The message says why and names the fixes.
    """
    style = model.cfg.mtp_style
    if layout == "qwen3_next":
        if style != "qwen3_next":
            raise ExportError(
                f"the Qwen3-Next layout serves modules that hand on their normed output and take logits "
                f"from the target's lm_head (mtp_style=qwen3_next), but this model's modules use "
                f"mtp_style={style} (pre-norm residual handed on, own shared_head): export with "
                "--layout deepseek_v3 (engines' DeepSeek MTP) or --layout draft (mtpx's draft_path)")
        parts, modules = [], []
        for k in range(1, num_modules):
            for part in QWEN3_NEXT_SHARED:
                a, b = model.mtp[0].get_submodule(part), model.mtp[k].get_submodule(part)
                if any(not torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters())):
                    parts += [part] if part not in parts else []
                    modules += [k] if k not in modules else []
        if modules:
            raise ExportError(
                f"the Qwen3-Next layout stores one mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden "
                f"and mtp.norm for all modules (vLLM's qwen3_next_mtp.py shares them), but "
                f"{', '.join(parts)} of module(s) {modules} differ from module 0's, so an engine would not "
                "compute what mtpx trained: export one module (--num-modules 1, as Qwen3-Next checkpoints "
                "carry), or write a draft file (--layout draft) that mtpx attaches with draft_path")
    elif layout == "deepseek_v3" and style != "deepseek_v3":
        raise ExportError(
            f"the DeepSeek layout serves modules that hand on their pre-norm residual and take logits "
            f"from their own shared_head (mtp_style=deepseek_v3), but this model's modules use "
            f"mtp_style={style} (normed output handed on, logits from lm_head), which that layout "
            "cannot express: train the modules with model.mtp_style=deepseek_v3, export with "
            "--layout qwen3_next, or write a draft file (--layout draft)")


def source_dtype(src: str | os.PathLike, allow_pickle: bool = False,
                 draft_path: str | os.PathLike | None = None) -> torch.dtype:
    """The floating dtype of checkpoint folder `src`'s weights (and of the draft file or folder
    `draft_path`, if given), from the safetensors headers: the one they all use, else the widest
    (float32 for a bfloat16/float16 mix, which it holds exactly). float32 when nothing tells
    (pickle weights, no floating tensor).

    Raises:
        FileNotFoundError: `src` is not a folder, or it has no weights (`weight_files`).
        mtpx.hf.loader.CheckpointError: unreadable safetensors, refused pickle weights.
    """
    if not Path(src).is_dir() and not any(Path(src).parent.glob(f".{Path(src).name}.old-*")):
        raise FileNotFoundError(f"checkpoint folder {src} does not exist: "
                                "give a checkpoint folder (mtpx or Hugging Face)")
    files = weight_files(require_folder(src), allow_pickle)  # names a ".old" folder left mid-save
    if draft_path is not None:
        draft = Path(draft_path)
        files += weight_files(draft, allow_pickle) if draft.is_dir() else [draft] if draft.is_file() else []
    found = set()
    for f in files:
        if f.suffix != ".safetensors":
            continue
        with _safe_open(f) as h:
            for k in h.keys():
                dt = _SAFETENSORS_DTYPES.get(h.get_slice(k).get_dtype())
                if dt is not None:
                    found.add(dt)
    if not found:
        return torch.float32
    if len(found) == 1:
        return found.pop()
    widest = max(found, key=lambda d: d.itemsize)
    return torch.float32 if widest.itemsize == 2 else widest


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer files of folder `src` (TOKENIZER_FILES, TOKENIZER_DIRS) into `dst`;
    for an mtpx tokenizer without tokenizer_config.json, write one naming `<|endoftext|>` (eos)
    and `<|pad|>` (pad). Returns the names written."""
    written = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            written.append(name)
    for name in TOKENIZER_DIRS:
        if (src / name).is_dir():
            shutil.copytree(src / name, dst / name)
            written.append(name)
    if ("tokenizer.json" in written and "tokenizer_config.json" not in written
            and _is_mtpx_tokenizer(dst / "tokenizer.json")):
        atomic_write_json(dst / "tokenizer_config.json",
                          tokenizer_config(load_tokenizer(dst / "tokenizer.json")))
        written.append("tokenizer_config.json")
    return written


# --------------------------------------------------------------------------------------------------
# helpers


def _check_args(layout: str | None, target_only: bool, out: Path) -> None:
    if layout is None and not target_only:
        raise ExportError(f"no layout given: choose one of {list(EXPORT_LAYOUTS)}")
    if layout is not None and layout not in EXPORT_LAYOUTS:
        raise ExportError(f"unknown layout '{layout}': choose one of {list(EXPORT_LAYOUTS)}")
    if layout == "draft":
        if target_only:
            raise ExportError("--layout draft writes only the MTP modules and --target-only only the "
                              "target: drop one of them")
        if out.suffix != ".safetensors":
            raise ExportError(f"a draft export is one safetensors file: give a path ending in "
                              f".safetensors (e.g. {out.with_suffix('.safetensors')}), not {out}")
        if out.is_dir():
            raise ExportError(f"{out} is a folder: a draft export is one file; give a file path")
    elif out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file: a {layout or 'target-only'} export is a folder; "
                          "give a folder path")


def _num_modules(model: MTPForCausalLM, num_modules: int | None) -> int:
    have = len(model.mtp)
    if num_modules is None:
        return have
    if not 0 <= num_modules <= have:
        raise ExportError(f"num_modules={num_modules} but the model has {have} MTP module(s): "
                          f"use 0..{have}")
    return num_modules


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.device == b.device and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.stride() == b.stride())


def _to_storable(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """CPU, `dtype` for floating tensors, contiguous, and no two names sharing storage
    (safetensors refuses shared tensors: aliases are cloned)."""
    out, seen = {}, set()
    for name, t in tensors.items():
        t = t.detach().to("cpu", dtype if t.is_floating_point() else t.dtype).contiguous()
        key = t.untyped_storage().data_ptr()
        if key in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _usual_mode(file: Path) -> None:
    """0o666 minus the umask (safetensors creates files 0o600), as mtpx.io's writers do."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(file, 0o666 & ~umask)


def _save_weights(tensors: dict[str, torch.Tensor], folder: Path, max_shard_bytes: int) -> None:
    """model.safetensors, or shards of at most max_shard_bytes (a tensor larger than that gets a
    shard of its own) plus model.safetensors.index.json, in transformers' naming."""
    sizes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, t in tensors.items():
        if shards[-1] and used + sizes[name] > max_shard_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = t
        used += sizes[name]
    if len(shards) == 1:
        safetensors.torch.save_file(shards[0], str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        _usual_mode(folder / WEIGHTS_FILE)
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        safetensors.torch.save_file(shard, str(folder / file), metadata={"format": "pt"})
        _usual_mode(folder / file)
        weight_map.update({name: file for name in shard})
    atomic_write_json(folder / INDEX_FILE, {"metadata": {"total_size": sum(sizes.values())},
                                            "weight_map": weight_map})


def _is_mtpx_tokenizer(file: Path) -> bool:
    try:
        added = json.loads(file.read_text(encoding="utf-8")).get("added_tokens") or []
    except (ValueError, OSError):
        return False
    ids = {t.get("content"): t.get("id") for t in added if isinstance(t, dict)}
    return all(ids.get(tok) == i for tok, i in _MTPX_SPECIAL.items())
