"""Decoder layer and the target language model (a Qwen3-Next-style hybrid, or a dense transformer
when every `layer_types` entry is "full_attention")."""
from __future__ import annotations

import torch
import torch.nn as nn

from mtpx.attention.kv_cache import KVCache
from mtpx.cache.state import LayerStates
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
        """x: [B, T, hidden] ([N, hidden] when meta.packed); cache: KVCache (attention) or
        RecurrentState (DeltaNet) or None.
        Under torch.compile with meta.compile_regions, a static forward runs as one compiled
        region per layer type and shape (`layer_region`)."""
        if meta is not None and meta.compile_regions and torch.compiler.is_compiling():
            return self._region(x, cos, sin, cache, meta)
        return self._forward(x, cos, sin, cache, meta)

    def _region(self, x, cos, sin, cache, meta: ForwardMeta):
        T = meta.positions.shape[1]
        linear = self.layer_type == "linear_attention"
        tensors = cache.views(T if meta.keep_states else 0) if linear else (cache.k, cache.v)
        # the block table flat: a [B, blocks] operand's strides would make Inductor guard on B
        # != 1 at the region's boundary (and a batch of one would compile again)
        out = layer_region(self, x, cos, sin, tensors, meta.positions, meta.valid, meta.rows,
                           meta.block_table, meta.slot_mapping, meta.block_size,
                           meta.keep_states, meta.gdn_backend, meta.packed)
        if linear and meta.keep_states:
            cache.mark_kept(meta.rows, T)
        return out

    def _forward(self, x, cos, sin, cache=None, meta: ForwardMeta | None = None):
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h = self.linear_attn(h, cache, meta)
        else:
            h = self.self_attn(h, cos, sin, cache, meta)
        x, h = self.post_attention_layernorm.forward_add(x, h)
        return x + self.mlp(h)


@torch.compiler.nested_compile_region(max_reuse_entries=32)
def layer_region(layer: DecoderLayer, x, cos, sin, tensors: tuple, positions, valid, rows, block_ids,
                 slot_mapping, block_size: int, keep_states: bool, gdn_backend: str,
                 packed=None) -> torch.Tensor:
    """A decoder layer over a static forward (ForwardMeta.static, no boundary states, the torch
    attention) from plain tensors, so that torch.compile traces and compiles it once per layer
    type and input shapes and reuses it for every layer (regional compilation: PyTorch's
    nested_compile_region, which needs tensor, constant and module inputs and no Python side
    effects). tensors: (k, v) of the layer's KVCache, or RecurrentState.views(); block_ids: the
    block table [B, blocks] flattened; packed: ForwardMeta.packed (x then [N, hidden]). Eager: a
    plain call."""
    meta = ForwardMeta(positions, valid, rows, None, block_ids, block_size,
                       slot_mapping, keep_states, gdn_backend=gdn_backend, region=True, packed=packed)
    cache = LayerStates(*tensors) if layer.layer_type == "linear_attention" else KVCache(*tensors)
    return layer._forward(x, cos, sin, cache, meta)


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
        """input_ids: [B, T] int64 -> final hidden states after `norm`, [B, T, hidden], or
        [N, hidden] for the N real tokens when meta.packed (the ragged layout: ForwardMeta.packed;
        meta.unpack puts them on the grid).

        Without caches: a plain causal forward from position 0 (training, reference).
        With caches (one per layer) and meta: an incremental forward (prefill, verification).
        """
        if meta is not None and meta.packed is not None:
            input_ids, positions = meta.pack(input_ids), meta.pack(meta.positions)
        else:
            positions = (torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
                         if meta is None else meta.positions)
        x = self.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, self.cfg.rotary_dim, self.cfg.rope_theta, x.dtype,
                                self.cfg.rope_scaling)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i], meta)
        return self.norm(x)
