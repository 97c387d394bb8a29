"""Which checkpoint tensor feeds which mtpx parameter (`plan_tensors`, for mtpx.hf.loader), checked
against the model config.json describes: missing, unexpected and misshapen tensors are named
(`CheckpointError`, at most 10 names per kind: `show_names`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mtpx.hf.layout import is_mtp, to_mtpx

_MAX_NAMES = 10  # names listed per category in a mismatch error
_IGNORED_TENSORS = ("rotary_emb.inv_freq",)  # buffers older checkpoints stored


class CheckpointError(ValueError):
    """A checkpoint folder exists but its contents disagree with what is expected."""


def show_names(names: list[str]) -> str:
    """"[a, b, ... (+N more)]": at most 10 tensor names for an error message."""
    more = f", ... (+{len(names) - _MAX_NAMES} more)" if len(names) > _MAX_NAMES else ""
    return "[" + ", ".join(names[:_MAX_NAMES]) + more + "]"


def check_names(file: Path, expected: dict[str, Any], stored: dict[str, Any]) -> None:
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    if not missing and not unexpected:
        return
    raise CheckpointError(
        f"{file} does not match config.json: {len(missing)} missing tensor(s) {show_names(missing)}; "
        f"{len(unexpected)} unexpected tensor(s) {show_names(unexpected)}: "
        "config.json and weights come from different models (e.g. num_nextn_predict_layers); "
        "re-save the checkpoint"
    )


def plan_tensors(model, shapes, layout, num_modules, where, folder, cfg,
                 draft_path=None) -> tuple[dict[str, str], list[str]]:
    """mtpx parameter name -> checkpoint tensor name (several parameters may read one tensor:
    Qwen3-Next's shared MTP tensors), after checking names and shapes; plus the names of
    DeepSeek's per-module embedding copies."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}
    optional = {f"mtp.{k}.head.weight" for k in range(num_modules)}  # tied to lm_head when absent
    if cfg.tie_word_embeddings:
        optional.add("lm_head.weight")  # transformers ignores a stored copy of a tied head
    plan: dict[str, str] = {}
    unexpected, copies = [], []
    for name in shapes:
        if name.endswith(_IGNORED_TENSORS):
            continue
        targets = to_mtpx(name, layout, cfg.num_hidden_layers, num_modules)
        if not targets:
            copies.append(name)
        for t in targets:
            if t in expected:
                plan[t] = name
            else:
                unexpected.append(name)
    if cfg.tie_word_embeddings:
        plan.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(plan) - optional)
    if (missing or unexpected) and draft_path is not None and all(
            n.startswith("mtp.") for n in missing) and all(is_mtp(n, cfg.num_hidden_layers)
                                                           for n in unexpected):
        raise CheckpointError(
            f"spec.draft_path {draft_path} does not fit the target {folder} ({cfg.model_type}): "
            f"{len(missing)} missing MTP tensor(s) {show_names(missing)}; {len(unexpected)} unexpected "
            f"{show_names(sorted(unexpected))}: the draft modules were trained for a different target "
            "(attention q/k norms, MoE or dense MLP follow the target's config.json)")
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}: the weights do not match config.json: {len(missing)} missing tensor(s) "
            f"{show_names(missing)}; {len(unexpected)} unexpected tensor(s) {show_names(sorted(unexpected))} "
            f"(MTP layout: {layout}, {num_modules} module(s)): config.json and the weights come from "
            "different models, or the download is incomplete")
    for name, ckpt_name in plan.items():
        if shapes[ckpt_name] != expected[name]:
            raise CheckpointError(
                f"{where[ckpt_name]}: tensor {ckpt_name} has shape {list(shapes[ckpt_name])} but config.json "
                f"implies {list(expected[name])}: config.json and the weights come from different models "
                "(check hidden_size, intermediate_size, head counts, head_dim, vocab_size, num_experts)")
    return plan, copies
