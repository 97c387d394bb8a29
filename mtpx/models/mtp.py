"""MTP draft module (DeepSeek-V3 §2.2 "Multi-Token Prediction"; Qwen3-Next's `mtp.*` head).

    a^k_j = norm(layer(fc(cat(pre_fc_norm_embedding(emb(x_{j+k})), pre_fc_norm_hidden(a^{k-1}_j)))))

a^0 = h, the target's final hidden state after its last norm; a^k_j predicts x_{j+k+1}. The
concatenation order is [embedding, hidden], as both Qwen3-Next (`Qwen3NextMultiTokenPredictor`)
and DeepSeek-V3 (`eh_proj(cat(enorm(e), hnorm(h)))`) use. Two conventions for what a module hands
on (`ModelConfig.mtp_style`, as vLLM's `qwen3_next_mtp.py` and `deepseek_mtp.py` serve them):

- "qwen3_next" (the formula above): the output passed to the next module is the normed vector,
  and logits = lm_head(a^k) with the target's lm_head.
- "deepseek_v3": a^k = layer(fc(...)), the residual stream before any norm, is passed on, and
  logits = shared_head.head(shared_head.norm(a^k)); here `norm` plays shared_head.norm and `head`
  is the module's own output head (tied to lm_head when the checkpoint's copy equals it). The
  embedding input at position 0 is zeroed, as vLLM's `DeepSeekMultiTokenPredictorLayer` does
  ("masking inputs at position 0, as not needed by MTP").

Module k at sequence index j runs at RoPE position j, the position of the hidden state it reads.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from mtpx.models.config import ModelConfig
from mtpx.models.decoder import DecoderLayer
from mtpx.attention.kv_cache import KVCache
from mtpx.attention.meta import ForwardMeta
from mtpx.models.norm import RMSNorm
from mtpx.models.rope import rope_cos_sin
from mtpx.models.linear import Linear


class MTPModule(nn.Module):
    """One MTP draft module: fc over [norm(emb), norm(hidden)], one full-attention decoder layer,
    a final norm (the formula and the two `mtp_style` conventions in the module doc)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        """layer_idx: the index the checkpoint family gives this module's decoder layer, which picks
        MoE or dense MLP by `cfg.is_moe_layer` (vLLM: k for Qwen3-Next's `mtp.layers.k`,
        num_hidden_layers + k for DeepSeek's `model.layers.{num_hidden_layers + k}`)."""
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.pre_fc_norm_embedding = RMSNorm(H, cfg.rms_norm_eps, cfg.rms_norm_unit_offset)
        self.pre_fc_norm_hidden = RMSNorm(H, cfg.rms_norm_eps, cfg.rms_norm_unit_offset)
        self.fc = Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(cfg, "full_attention", layer_idx)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps, cfg.rms_norm_unit_offset)
        self.prenorm_output = cfg.mtp_style == "deepseek_v3"
        self.head = (Linear(H, cfg.vocab_size, bias=False) if self.prenorm_output else None)

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache=None, meta: ForwardMeta | None = None) -> torch.Tensor:
        """emb: [B, T, hidden] embeddings of x_{j+k}; hidden: [B, T, hidden] a^{k-1}_j;
        positions: [B, T] int64 (j) -> a^k: [B, T, hidden]. Under torch.compile with
        meta.compile_regions, one compiled region serves every module of the same shapes
        (`module_region`)."""
        if meta is not None and meta.compile_regions and torch.compiler.is_compiling():
            return module_region(self, emb, hidden, positions, cache.k, cache.v, meta.positions, meta.valid,
                                 meta.rows, meta.block_table, meta.slot_mapping, meta.block_size)
        return self._forward(emb, hidden, positions, cache, meta)

    def _forward(self, emb, hidden, positions, cache=None, meta: ForwardMeta | None = None):
        if self.prenorm_output:  # DeepSeek convention (module doc)
            emb = emb.masked_fill((positions == 0)[..., None], 0.0)
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], -1))
        cos, sin = rope_cos_sin(positions, self.cfg.rotary_dim, self.cfg.rope_theta, x.dtype,
                                self.cfg.rope_scaling)
        a = self.layers[0](x, cos, sin, cache, meta)
        return a if self.prenorm_output else self.norm(a)

    def logits(self, a: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """a: [..., hidden], this module's output -> [..., vocab] (module doc: lm_head(a) for
        "qwen3_next", head(norm(a)) for "deepseek_v3")."""
        return self.head(self.norm(a)) if self.prenorm_output else lm_head(a)


@torch.compiler.nested_compile_region(max_reuse_entries=32)
def module_region(module: MTPModule, emb, hidden, positions, k, v, meta_positions, valid, rows, block_table,
                  slot_mapping, block_size: int) -> torch.Tensor:
    """An MTP module over a static forward (ForwardMeta.static, the torch attention) from plain
    tensors, compiled once and reused by every module of the same shapes (regional compilation,
    as mtpx.models.decoder.layer_region, which it contains: its layer runs inline). k, v: the
    module's KVCache. Eager: a plain call."""
    meta = ForwardMeta(meta_positions, valid, rows, None, block_table, block_size, slot_mapping)
    return module._forward(emb, hidden, positions, KVCache(k, v), meta)
