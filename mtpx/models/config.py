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
from dataclasses import dataclass, field
from pathlib import Path

LAYER_TYPES = ("linear_attention", "full_attention")
MTP_STYLES = ("qwen3_next", "deepseek_v3")
ROPE_TYPES = ("default", "linear", "llama3")


_MAY_BE_ZERO = {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                "num_nextn_predict_layers", "decoder_sparse_step"}


@dataclass
class ModelConfig:
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    # gated full attention (Qwen3-Next: q_proj emits query and an output gate per head)
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    partial_rotary_factor: float = 0.25  # RoPE is applied to the first head_dim * factor dims only
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None, {"rope_type": "linear", "factor"} or Llama 3's "llama3"
    attn_output_gate: bool = True  # Qwen3-Next: q_proj also emits a sigmoid output gate per head
    use_qk_norm: bool = True       # Qwen3 / Qwen3-Next: RMSNorm on each q and k head (Llama: off)
    attention_bias: bool = False   # bias on q/k/v/o_proj (Hugging Face Llama/Qwen3 convention)
    # Gated DeltaNet (linear attention)
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_conv_kernel_dim: int = 4
    # layer schedule: every full_attention_interval-th layer is full attention (Qwen3-Next: 4)
    full_attention_interval: int = 2
    layer_types: list[str] | None = None  # derived from full_attention_interval when None
    # mixture of experts (optional; num_experts = 0 means a dense SwiGLU MLP in every layer)
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 128
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    mlp_bias: bool = False         # bias on gate/up/down_proj (Hugging Face Llama convention)
    # misc
    rms_norm_eps: float = 1e-6
    # Qwen3-Next's zero-centred RMSNorm, x / rms(x) * (1 + weight); False: Llama's x / rms(x) * weight
    rms_norm_unit_offset: bool = True
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    hidden_act: str = "silu"
    num_nextn_predict_layers: int = 8
    # how draft module k hands its output on and turns it into logits (mtpx.models.mtp):
    # "qwen3_next": a^k = norm(block) is passed on and logits = lm_head(a^k);
    # "deepseek_v3": a^k = block output is passed on and logits = shared_head.head(shared_head.norm(a^k))
    mtp_style: str = "qwen3_next"
    eos_token_id: int | list[int] | None = 0  # a list: any of them ends a request (Llama 3 instruct)
    bos_token_id: int | None = None
    model_type: str = "qwen3_next"

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
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"unknown layer type(s) {bad}: use {LAYER_TYPES}")
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
        if self.num_nextn_predict_layers < 0:
            raise ValueError("num_nextn_predict_layers must be >= 0")
        if self.mtp_style not in MTP_STYLES:
            raise ValueError(f"unknown mtp_style '{self.mtp_style}': use one of {MTP_STYLES}")
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
                raise ValueError(f"model config {f.name}={value!r}: must be a list (e.g. [\"linear_attention\", "
                                 "\"full_attention\"] for layer_types)")

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
