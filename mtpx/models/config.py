"""Model configuration: one dataclass whose field names follow Hugging Face's `Qwen3NextConfig`.

The same config describes a hybrid decoder (Gated DeltaNet layers interleaved with gated full
attention, as Qwen3-Next) and a standard dense transformer (`layer_types` all "full_attention"),
e.g. Llama or Qwen3: the family conventions are plain flags (`attn_output_gate`, `use_qk_norm`,
`rms_norm_unit_offset`, `attention_bias`, `mlp_bias`, `rope_scaling`), set from a Hugging Face
config.json by `mtpx.hf.config.config_from_hf`.
`num_nextn_predict_layers` is the number of MTP draft modules the checkpoint carries (DeepSeek-V3's
name for it; Qwen3-Next calls it `mtp_num_hidden_layers`, accepted as an alias by `from_dict`).
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROPE_TYPES = ("default", "linear", "llama3")


def literal_choices(cls: type, lists: bool = False) -> dict[str, tuple]:
    """{field: its choices} for the fields of dataclass `cls` annotated Literal[...] or
    Optional[Literal[...]] (None among the choices when optional); lists=True: those annotated
    list[Literal[...]] (or Optional of it), with the choices of each entry."""
    out = {}
    for name, tp in typing.get_type_hints(cls).items():
        args = (tp,) if typing.get_origin(tp) in (Literal, list) else typing.get_args(tp)
        for a in args:
            if lists and typing.get_origin(a) is list and typing.get_origin(typing.get_args(a)[0]) is Literal:
                out[name] = typing.get_args(typing.get_args(a)[0])
            elif not lists and typing.get_origin(a) is Literal:
                out[name] = typing.get_args(a) + ((None,) if type(None) in args else ())
    return out


def check_choice(key: str, value, choices: tuple, verb: str = "choose one of") -> None:
    """ValueError "KEY='x': choose one of a, b" (null for None) when value is not among choices."""
    if value not in choices:
        shown = ", ".join("null" if c is None else str(c) for c in choices)
        raise ValueError(f"{key}={value!r}: {verb} {shown}")


_MAY_BE_ZERO = {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "num_nextn_predict_layers", "decoder_sparse_step"}


@dataclass
class ModelConfig:
    """The target and its MTP modules (Hugging Face Qwen3NextConfig's names and meanings). Raises
    ValueError in __post_init__ naming the key for a value of the wrong type, a choice outside its
    Literal, or shapes that do not fit together."""

    vocab_size: int = 2048
    """Tokens in the vocabulary: rows of the embedding and of lm_head."""
    hidden_size: int = 128
    """Width of the residual stream (the hidden states)."""
    intermediate_size: int = 384
    """Width of the dense SwiGLU MLP's gate and up projections."""
    num_hidden_layers: int = 4
    """Decoder layers of the target (the MTP modules are extra)."""
    num_attention_heads: int = 4
    """Query heads of a full-attention layer (Qwen3-Next: q_proj also emits an output gate per
    head)."""
    num_key_value_heads: int = 2
    """Key/value heads of a full-attention layer (grouped-query attention); divides
    num_attention_heads."""
    head_dim: int = 32
    """Dimension of each attention head."""
    partial_rotary_factor: float = 0.25
    """RoPE rotates the first head_dim * partial_rotary_factor dimensions of each head only."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rope_scaling: dict | None = None
    """None (plain RoPE), {"rope_type": "linear", "factor": f} or Llama 3's {"rope_type": "llama3",
    ...} (ROPE_TYPES)."""
    attn_output_gate: bool = True
    """Qwen3-Next: q_proj also emits a sigmoid output gate per head (Llama, Qwen3: off)."""
    use_qk_norm: bool = True
    """RMSNorm on each query and key head (Qwen3, Qwen3-Next; Llama: off)."""
    attention_bias: bool = False
    """Bias on q/k/v/o_proj (Hugging Face's Llama / Qwen3 attention_bias)."""
    linear_num_key_heads: int = 2
    """Gated DeltaNet (linear attention) query/key heads."""
    linear_num_value_heads: int = 4
    """Gated DeltaNet value heads; a multiple of linear_num_key_heads."""
    linear_key_head_dim: int = 32
    """Gated DeltaNet query/key head dimension."""
    linear_value_head_dim: int = 32
    """Gated DeltaNet value head dimension (the recurrent state is key x value per head)."""
    linear_conv_kernel_dim: int = 4
    """Width of the Gated DeltaNet's short causal convolution, in tokens."""
    full_attention_interval: int = 2
    """Every this-many-th layer is full attention, the others Gated DeltaNet (Qwen3-Next: 4);
    used when layer_types is None."""
    layer_types: list[Literal["linear_attention", "full_attention"]] | None = None
    """One type per layer; None: derived from full_attention_interval (all "full_attention": a
    dense transformer such as Llama or Qwen3)."""
    num_experts: int = 0
    """Routed experts of a mixture-of-experts MLP (0: a dense SwiGLU MLP in every layer)."""
    num_experts_per_tok: int = 2
    """Experts each token is routed to (top-k)."""
    moe_intermediate_size: int = 128
    """Width of each routed expert's MLP."""
    shared_expert_intermediate_size: int = 128
    """Width of the shared expert's MLP, gated per token as Qwen3-Next's."""
    norm_topk_prob: bool = True
    """Renormalise the top-k routing weights to sum to 1."""
    decoder_sparse_step: int = 1
    """A layer is MoE when (layer index + 1) is a multiple of this (and it is not in
    mlp_only_layers)."""
    mlp_only_layers: list[int] = field(default_factory=list)
    """Layer indices that keep a dense MLP although experts exist."""
    mlp_bias: bool = False
    """Bias on gate/up/down_proj (Hugging Face's Llama mlp_bias)."""
    rms_norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    rms_norm_unit_offset: bool = True
    """Qwen3-Next's zero-centred RMSNorm, x / rms(x) * (1 + weight); False: Llama's
    x / rms(x) * weight."""
    max_position_embeddings: int = 1024
    """Positions the model serves (the engine's max_model_len at most)."""
    tie_word_embeddings: bool = False
    """lm_head shares the embedding's weight."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of a fresh model's weights."""
    hidden_act: Literal["silu"] = "silu"
    """The MLPs' activation (mtpx implements SwiGLU only)."""
    num_nextn_predict_layers: int = 8
    """MTP draft modules the checkpoint carries (DeepSeek-V3's name; Qwen3-Next's
    mtp_num_hidden_layers, accepted by from_dict)."""
    mtp_style: Literal["qwen3_next", "deepseek_v3"] = "qwen3_next"
    """How draft module k hands its output on and turns it into logits (mtpx.models.mtp):
    qwen3_next: a^k = norm(block) is passed on and logits = lm_head(a^k); deepseek_v3: the block's
    output is passed on and logits = shared_head.head(shared_head.norm(a^k))."""
    eos_token_id: int | list[int] | None = 0
    """The end-of-sequence id; a list: any of them ends a request (Llama 3 instruct)."""
    bos_token_id: int | None = None
    """The beginning-of-sequence id, as config.json gives it (None: none)."""
    model_type: Literal["qwen3_next", "qwen3", "llama"] = "qwen3_next"
    """The Hugging Face family the checkpoint exports to and loads from (mtpx.hf.config.FAMILIES)."""

    def __post_init__(self):
        self._check_types()
        if self.layer_types is None:
            self.layer_types = [
                "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)
            ]
        self.layer_types = list(self.layer_types)
        self.mlp_only_layers = list(self.mlp_only_layers)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is "
                f"{self.num_hidden_layers}: give one type per layer"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in ROPE_TYPES:
                raise ValueError(f"rope_scaling type '{kind}' is not supported: mtpx implements {ROPE_TYPES}")

    def _check_types(self) -> None:
        """Each field of the types its annotation names (config.json may hold strings, nulls or
        negative sizes): ValueError naming the key, before any shape arithmetic uses it."""
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), str(f.type).replace(" ", "")
            if kind == "int":
                ok = isinstance(value, int) and not isinstance(value, bool)
                low = 0 if f.name in _MAY_BE_ZERO else 1
                if not ok or value < low:
                    raise ValueError(f"model config {f.name}={value!r}: must be an integer >= {low}")
            elif kind == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value:
                    raise ValueError(f"model config {f.name}={value!r}: must be a number")
            elif kind == "bool" and not isinstance(value, bool):
                raise ValueError(f"model config {f.name}={value!r}: must be true or false")
            elif kind.startswith("list[") and value is not None and not isinstance(value, (list, tuple)):
                raise ValueError(f"model config {f.name}={value!r}: must be a list (e.g. "
                                 "[\"linear_attention\", \"full_attention\"] for layer_types)")
        for name, choices in literal_choices(type(self)).items():
            check_choice(f"model config {name}", getattr(self, name), choices)
        for name, choices in literal_choices(type(self), lists=True).items():
            for i, value in enumerate(getattr(self, name) or ()):
                check_choice(f"model config {name}[{i}]", value, choices)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Qwen3-Next's rule: MoE when experts exist, the layer is not in `mlp_only_layers` and
        (layer_idx + 1) is a multiple of `decoder_sparse_step`."""
        return (
            self.num_experts > 0
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build from a dict (config.json). Raises ValueError naming keys this config does not know."""
        d = dict(d)
        if "mtp_num_hidden_layers" in d and "num_nextn_predict_layers" not in d:
            d["num_nextn_predict_layers"] = d.pop("mtp_num_hidden_layers")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown model config key(s) {unknown}: known keys are {sorted(known)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))
