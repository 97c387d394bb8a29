"""Decoder layer and the target language model (a Qwen3-Next-style hybrid, or a dense transformer
when every `layer_types` entry is "full_attention")."""
from __future__ import annotations

import torch
import torch.nn as nn

from mtpx.models.attention import GatedAttention
from mtpx.models.config import ModelConfig
from mtpx.models.deltanet import GatedDeltaNet
from mtpx.attention.meta import ForwardMeta
from mtpx.models.mlp import build_mlp
from mtpx.models.norm import RMSNorm
from mtpx.models.rope import rope_cos_sin


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then + mlp(norm(x)). The mixer is
    `linear_attn` (Gated DeltaNet) or `self_attn` (gated attention), named as in Qwen3-Next."""

    def __init__(self, cfg: ModelConfig, layer_type: str, layer_idx: int):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = build_mlp(cfg, layer_idx)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.rms_norm_unit_offset)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.rms_norm_unit_offset)

    def cache_spec(self):
        """The mixer's cache needs (KVCacheSpec or RecurrentStateSpec)."""
        mixer = self.linear_attn if self.layer_type == "linear_attention" else self.self_attn
        return mixer.cache_spec()

    def forward(self, x, cos, sin, cache=None, meta: ForwardMeta | None = None):
        """x: [B, T, hidden]; cache: KVCache (attention) or RecurrentState (DeltaNet) or None."""
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h = self.linear_attn(h, cache, meta)
        else:
            h = self.self_attn(h, cos, sin, cache, meta)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """Embedding, decoder layers and the final norm (HF `Qwen3NextModel`, weights under `model.`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(cfg, t, i) for i, t in enumerate(cfg.layer_types)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.rms_norm_unit_offset)

    def forward(self, input_ids: torch.Tensor, meta: ForwardMeta | None = None,
                caches: list | None = None) -> torch.Tensor:
        """input_ids: [B, T] int64 -> final hidden states after `norm`, [B, T, hidden].

        Without caches: a plain causal forward from position 0 (training, reference).
        With caches (one per layer) and meta: an incremental forward (prefill, verification).
        """
        x = self.embed_tokens(input_ids)
        positions = (torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
                     if meta is None else meta.positions)
        cos, sin = rope_cos_sin(positions, self.cfg.rotary_dim, self.cfg.rope_theta, x.dtype,
                                self.cfg.rope_scaling)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i], meta)
        return self.norm(x)
