"""Where MTP draft-module weights live in a checkpoint, and their mtpx names.

mtpx keeps draft module k (0-based) under `mtp.{k}.` with the names of `MTPModule`
(`pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `fc`, `layers.0.*`, `norm`, and `head` for the
DeepSeek convention). Checkpoints use one of three layouts:

- "mtpx": exactly those names (mtpx checkpoints and draft files).
- "qwen3_next" (Qwen/Qwen3-Next checkpoints; read by vLLM's `qwen3_next_mtp.py`): one `mtp.fc`,
  `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden` and `mtp.norm` shared by every module, and
  one decoder layer per module, `mtp.layers.{k}.*`.
- "deepseek_v3" (DeepSeek-V3 checkpoints; vLLM's `deepseek_mtp.py`): module k is decoder layer
  `model.layers.{num_hidden_layers + k}` with `enorm` (embedding norm), `hnorm` (hidden norm),
  `eh_proj` (the fc), `shared_head.norm`, `shared_head.head`, an optional copy of
  `embed_tokens`, and the usual block weights (`self_attn`, `mlp`, `*_layernorm`).

Target weights (`model.embed_tokens`, `model.layers.{i < num_hidden_layers}`, `model.norm`,
`lm_head`) have the same names in all three.
"""
from __future__ import annotations

import re

LAYOUTS = ("mtpx", "qwen3_next", "deepseek_v3")
QWEN3_NEXT_SHARED = ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
_DEEPSEEK_RENAMES = {"enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden",
                     "eh_proj": "fc", "shared_head.norm": "norm", "shared_head.head": "head"}
_DEEPSEEK_MARKERS = ("enorm", "hnorm", "eh_proj", "shared_head")  # a layer holding these is an MTP module
_MTPX_RE = re.compile(r"^mtp\.(\d+)\.(.+)$")
_QWEN_LAYER_RE = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


class LayoutError(ValueError):
    """A checkpoint's tensor names fit no known MTP layout, or mix several."""


def detect_layout(names, num_hidden_layers: int) -> tuple[str | None, int]:
    """Which MTP layout the tensor `names` use and how many modules they hold. A decoder layer
    `model.layers.{i >= num_hidden_layers}` counts as a DeepSeek MTP module only when it holds
    `enorm`/`hnorm`/`eh_proj`/`shared_head` (else it is an unexpected target layer).

    Returns (layout or None when there are no MTP tensors, number of modules).
    Raises LayoutError when names of two layouts are mixed.
    """
    found: dict[str, set[int]] = {}
    for n in names:
        if m := _QWEN_LAYER_RE.match(n):
            found.setdefault("qwen3_next", set()).add(int(m[1]))
        elif n.startswith("mtp.") and n.split(".")[1] in QWEN3_NEXT_SHARED:
            found.setdefault("qwen3_next", set())
        elif m := _MTPX_RE.match(n):
            found.setdefault("mtpx", set()).add(int(m[1]))
        elif ((m := _LAYER_RE.match(n)) and int(m[1]) >= num_hidden_layers
              and m[2].split(".")[0] in _DEEPSEEK_MARKERS):
            found.setdefault("deepseek_v3", set()).add(int(m[1]) - num_hidden_layers)
    if len(found) > 1:
        raise LayoutError(f"tensor names mix MTP layouts {sorted(found)}: keep one layout per checkpoint")
    if not found:
        return None, 0
    (layout, modules), = found.items()
    return layout, (max(modules) + 1 if modules else 0)


def is_mtp(name: str, num_hidden_layers: int) -> bool:
    """True for a tensor of an MTP module in any layout."""
    m = _LAYER_RE.match(name)
    return name.startswith("mtp.") or (m is not None and int(m[1]) >= num_hidden_layers)


def to_mtpx(name: str, layout: str | None, num_hidden_layers: int, num_modules: int) -> list[str]:
    """The mtpx name(s) a checkpoint tensor loads into: one name, several (a Qwen3-Next shared
    tensor goes to every module) or none (DeepSeek's per-module `embed_tokens` copy, which must
    equal the target's; the loader checks it)."""
    if layout == "qwen3_next" and name.startswith("mtp."):
        if m := _QWEN_LAYER_RE.match(name):
            return [f"mtp.{m[1]}.layers.0.{m[2]}"]
        return [f"mtp.{k}.{name[4:]}" for k in range(num_modules)]
    if layout == "deepseek_v3" and (m := _LAYER_RE.match(name)) and int(m[1]) >= num_hidden_layers:
        k, rest = int(m[1]) - num_hidden_layers, m[2]
        if rest.startswith("embed_tokens."):
            return []
        for old, new in _DEEPSEEK_RENAMES.items():
            if rest.startswith(old + "."):
                return [f"mtp.{k}.{new}{rest[len(old):]}"]
        return [f"mtp.{k}.layers.0.{rest}"]
    return [name]


def from_mtpx(name: str, layout: str, num_hidden_layers: int) -> str | None:
    """The checkpoint name of mtpx tensor `name` in `layout`; None for a tensor the layout stores
    once for all modules and this is not module 0's copy (Qwen3-Next's shared fc and norms)."""
    m = _MTPX_RE.match(name)
    if m is None or layout == "mtpx":
        return name
    k, rest = int(m[1]), m[2]
    if layout == "qwen3_next":
        if rest.startswith("layers.0."):
            return f"mtp.layers.{k}.{rest[len('layers.0.'):]}"
        return f"mtp.{rest}" if k == 0 else None
    if layout == "deepseek_v3":
        prefix = f"model.layers.{num_hidden_layers + k}."
        if rest.startswith("layers.0."):
            return prefix + rest[len("layers.0."):]
        for old, new in _DEEPSEEK_RENAMES.items():
            if rest.startswith(new + "."):
                return prefix + old + rest[len(new):]
    raise LayoutError(f"tensor {name} has no name in the {layout} layout")
