"""Hugging Face config.json <-> mtpx `ModelConfig`.

mtpx's `ModelConfig` uses Qwen3-Next's field names, so most keys copy over unchanged. What differs
per family (`model_type`) is fixed here, with the Hugging Face class each convention comes from:

| `model_type` | architecture           | attention                           | RMSNorm                |
|--------------|------------------------|-------------------------------------|------------------------|
| `qwen3_next` | `Qwen3NextForCausalLM` | output gate, q/k norm, partial RoPE | x*(1+w) (zero-centred) |
| `qwen3`      | `Qwen3ForCausalLM`     | q/k norm, full RoPE                 | x*w                    |
| `llama`      | `LlamaForCausalLM`     | plain, full RoPE, `mlp_bias`        | x*w                    |

RoPE comes from `rope_parameters` (transformers >= 5) or `rope_theta` / `partial_rotary_factor` /
`rope_scaling` (transformers 4). The number of MTP modules is `mtp_num_hidden_layers` (Qwen3-Next)
or `num_nextn_predict_layers` (DeepSeek-V3); the loader checks it against the tensors it finds.
"""
from __future__ import annotations

import warnings

from mtpx.models.config import ModelConfig

FAMILIES = {
    "qwen3_next": dict(attn_output_gate=True, use_qk_norm=True, rms_norm_unit_offset=True),
    "qwen3": dict(attn_output_gate=False, use_qk_norm=True, rms_norm_unit_offset=False),
    "llama": dict(attn_output_gate=False, use_qk_norm=False, rms_norm_unit_offset=False),
}
ARCHITECTURES = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "llama": "LlamaForCausalLM"}

# shape-defining keys every config.json must have (mtpx never guesses a size)
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# a key absent from config.json takes the default of the family's transformers config class
# (LlamaConfig, Qwen3Config, Qwen3NextConfig in transformers 5.24), never mtpx's own default
_COMMON_DEFAULTS = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
HF_DEFAULTS = {
    "llama": dict(_COMMON_DEFAULTS, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2),
    "qwen3": dict(_COMMON_DEFAULTS, max_position_embeddings=32768, bos_token_id=None, eos_token_id=None,
                  head_dim=128),
    "qwen3_next": dict(_COMMON_DEFAULTS, max_position_embeddings=32768, bos_token_id=None, eos_token_id=None,
                       head_dim=256, num_key_value_heads=2, num_experts=512, num_experts_per_tok=10,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512,
                       decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[],
                       linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_num_key_heads=16, linear_num_value_heads=32, full_attention_interval=4),
}

# keys copied as they are when present
_COPIED = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
    "tie_word_embeddings", "attention_bias", "mlp_bias", "initializer_range", "eos_token_id",
    "bos_token_id",
    # Qwen3-Next only
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval", "num_experts",
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
    "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
)
# keys that do not change the forward pass at inference (dropout, training losses, bookkeeping)
_IGNORED = {
    "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "use_cache",
    "attention_dropout", "output_router_logits", "router_aux_loss_coef", "pad_token_id",
    "pretraining_tp", "max_window_layers", "sliding_window", "use_sliding_window", "layer_types",
    "rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor", "hidden_act",
    "mtp_num_hidden_layers", "num_nextn_predict_layers", "mtp_use_dedicated_embeddings",
    "mtp_style", "quantization_config", "_name_or_path", "id2label", "label2id",
    "tokenizer_class", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "use_bfloat16", "chunk_size_feed_forward", "is_encoder_decoder",
    "problem_type", "auto_map", "mlp_ratio", "bad_words_ids", "decoder_start_token_id",
}


class UnsupportedConfigError(ValueError):
    """config.json describes a model mtpx cannot run exactly."""


def config_from_hf(d: dict, file: str = "config.json") -> ModelConfig:
    """A Hugging Face config.json dict -> ModelConfig (family conventions in the module doc).
    Keys absent from `d` take the defaults of the family's transformers config class
    (`HF_DEFAULTS`); the sizes in `REQUIRED` must be present.

    `num_nextn_predict_layers` is set from `mtp_num_hidden_layers` / `num_nextn_predict_layers`
    (0 when absent); the loader replaces it with the count of MTP modules in the weights.

    Raises:
        UnsupportedConfigError: an unknown `model_type` or one whose math mtpx does not implement
            (quantization, sliding-window attention, an activation other than SiLU, a RoPE
            scaling type other than default/linear/llama3, dedicated MTP embeddings); the message
            names the key and the families mtpx supports.
    """
    family = d.get("model_type")
    if family not in FAMILIES:
        raise UnsupportedConfigError(
            f"{file}: model_type '{family}' is not supported: mtpx loads {sorted(FAMILIES)} targets "
            "(DeepSeek-style MTP heads are read on any of them)")
    _refuse(d, file)
    _check_types(d, file)
    missing = [k for k in REQUIRED if d.get(k) is None]
    if missing:
        raise UnsupportedConfigError(f"{file} lacks {missing}: a checkpoint's config.json must give its "
                                     "sizes; download the complete config.json")
    out = dict(HF_DEFAULTS[family])
    out["num_key_value_heads"] = out.get("num_key_value_heads", d["num_attention_heads"])
    out["head_dim"] = out.get("head_dim", d["hidden_size"] // d["num_attention_heads"])
    out.update({k: d[k] for k in _COPIED if k in d and (d[k] is not None or k.endswith("token_id"))})
    out.update(FAMILIES[family], model_type=family)
    out.update(_rope(d, family))
    if family == "qwen3_next":
        if d.get("layer_types") is not None:
            out["layer_types"] = list(d["layer_types"])
    else:
        out["layer_types"] = ["full_attention"] * d["num_hidden_layers"]
        out.setdefault("intermediate_size", 4 * d["hidden_size"])
    num_mtp = d.get("mtp_num_hidden_layers", d.get("num_nextn_predict_layers")) or 0
    out["num_nextn_predict_layers"] = int(num_mtp)
    if d.get("mtp_style") is not None:
        out["mtp_style"] = d["mtp_style"]
    unknown = sorted(set(d) - set(_COPIED) - _IGNORED)
    if unknown:
        warnings.warn(f"{file}: ignoring key(s) {unknown}, which mtpx's {family} model does not use",
                      stacklevel=2)
    try:
        return ModelConfig(**out)
    except (TypeError, ValueError) as err:
        raise UnsupportedConfigError(f"{file}: {err}") from None


_BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "norm_topk_prob")
_NUMBER_KEYS = tuple(k for k in _COPIED
                     if k not in _BOOL_KEYS + ("mlp_only_layers", "eos_token_id", "bos_token_id")) + (
    "rope_theta", "partial_rotary_factor", "mtp_num_hidden_layers", "num_nextn_predict_layers")


def _check_types(d: dict, file: str) -> None:
    """Raises UnsupportedConfigError naming a size or flag of the wrong JSON type ("64" for 64)."""
    for k in _NUMBER_KEYS:
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise UnsupportedConfigError(f"{file}: {k}={v!r} must be a number, not {type(v).__name__}: "
                                         f"write it without quotes (\"{k}\": "
                                         f"{v if isinstance(v, str) else 0})")
    for k in _BOOL_KEYS:
        v = d.get(k)
        if v is not None and not isinstance(v, bool):
            raise UnsupportedConfigError(f"{file}: {k}={v!r} must be true or false")


def _refuse(d: dict, file: str) -> None:
    if d.get("quantization_config"):
        method = d["quantization_config"].get("quant_method", "?")
        raise UnsupportedConfigError(
            f"{file}: a quantized checkpoint ({method}); mtpx runs bf16/fp16/fp32 weights: use the "
            "unquantized checkpoint")
    if d.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"{file}: hidden_act '{d['hidden_act']}' is not supported: "
                                     "mtpx's MLPs use silu")
    if d.get("use_sliding_window") or any(t == "sliding_attention" for t in d.get("layer_types") or []):
        raise UnsupportedConfigError(
            f"{file}: sliding-window attention is not supported: set use_sliding_window=false")
    if d.get("mtp_use_dedicated_embeddings"):
        raise UnsupportedConfigError(
            f"{file}: mtp_use_dedicated_embeddings=true is not supported: mtpx's MTP modules share "
            "the target's embedding")


def _rope(d: dict, family: str) -> dict:
    """RoPE keys from `rope_parameters` (transformers 5) or the transformers-4 keys."""
    default_partial = 0.25 if family == "qwen3_next" else 1.0
    p = dict(d.get("rope_parameters") or {})
    legacy = dict(d.get("rope_scaling") or {})
    theta = p.pop("rope_theta", d.get("rope_theta", 10000.0))
    partial = p.pop("partial_rotary_factor", d.get("partial_rotary_factor", default_partial))
    scaling = p or legacy
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    return dict(rope_theta=float(theta), partial_rotary_factor=float(partial),
                rope_scaling=None if kind == "default" else {**scaling, "rope_type": kind})


def config_to_hf(cfg: ModelConfig, mtp_layout: str | None) -> dict:
    """ModelConfig -> a Hugging Face config.json dict for `cfg.model_type`'s architecture, with the
    MTP count under the key the layout's readers use: `mtp_num_hidden_layers` (Qwen3-Next layout,
    as Qwen/Qwen3-Next checkpoints) or `num_nextn_predict_layers` (DeepSeek layout).

    mtp_layout: "qwen3_next", "deepseek_v3" or None (no MTP modules written).

    Raises:
        UnsupportedConfigError: cfg's flags do not match its family's conventions (an mtpx-only
            variant no Hugging Face class reproduces), or an unknown model_type.
    """
    family = cfg.model_type
    if family not in FAMILIES:
        raise UnsupportedConfigError(f"model_type '{family}' has no Hugging Face architecture in mtpx: "
                                     f"use one of {sorted(FAMILIES)}")
    for key, want in FAMILIES[family].items():
        if getattr(cfg, key) != want:
            raise UnsupportedConfigError(
                f"{key}={getattr(cfg, key)} does not match {ARCHITECTURES[family]} ({key}={want}): "
                "no Hugging Face class computes this model")
    d = {"architectures": [ARCHITECTURES[family]], "model_type": family}
    for k in _COPIED:
        if family != "qwen3_next" and (k.startswith("linear_") or k in (
                "full_attention_interval", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                "mlp_only_layers")):
            continue
        d[k] = getattr(cfg, k)
    if family == "qwen3_next":
        d["layer_types"] = list(cfg.layer_types)
    elif any(t != "full_attention" for t in cfg.layer_types):
        raise UnsupportedConfigError(f"{ARCHITECTURES[family]} has full attention in every layer; "
                                     f"this model's layer_types are {cfg.layer_types}")
    d["hidden_act"] = "silu"
    rope = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rope_theta}
    if family == "qwen3_next" or cfg.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = cfg.partial_rotary_factor
    d["rope_parameters"] = rope
    d["rope_theta"] = cfg.rope_theta                      # transformers 4 readers (vLLM)
    if cfg.rope_scaling:
        d["rope_scaling"] = dict(cfg.rope_scaling)
    if family == "qwen3_next":
        d["partial_rotary_factor"] = cfg.partial_rotary_factor
    n = cfg.num_nextn_predict_layers if mtp_layout else 0
    if mtp_layout == "qwen3_next":  # Qwen/Qwen3-Next's key; vLLM sizes its MTP stack from the other
        d["mtp_num_hidden_layers"] = d["num_nextn_predict_layers"] = n
    elif mtp_layout == "deepseek_v3":
        d["num_nextn_predict_layers"] = n
    d["dtype"] = "float32"
    return d
