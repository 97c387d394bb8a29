"""MTP draft module (DeepSeek-V3 §2.2 "Multi-Token Prediction"; Qwen3-Next's `mtp.*` head).

    a^k_j = norm(layer(fc(cat(pre_fc_norm_embedding(emb(x_{j+k})), pre_fc_norm_hidden(a^{k-1}_j)))))

a^0 = h, the target's final hidden state after its last norm; a^k_j predicts x_{j+k+1} through the
target's shared lm_head. The concatenation order is [embedding, hidden], as both Qwen3-Next
(`Qwen3NextMultiTokenPredictor`) and DeepSeek-V3 (`eh_proj(cat(enorm(e), hnorm(h)))`) use. The
output passed to the next module is the normed vector fed to lm_head (Qwen3-Next's convention).
Module k at sequence index j runs at RoPE position j, the position of the hidden state it reads.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from mtpx.models.config import ModelConfig
from mtpx.models.decoder import DecoderLayer
from mtpx.models.meta import ForwardMeta
from mtpx.models.norm import RMSNorm
from mtpx.models.rope import rope_cos_sin


class MTPModule(nn.Module):
    """One MTP draft module: fc over [norm(emb), norm(hidden)], one full-attention decoder layer,
    a final norm (the formula in the module doc). Logits come from the target's lm_head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.pre_fc_norm_embedding = RMSNorm(H, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(H, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        # one full-attention decoder layer; its MLP follows the target's last layer (dense or MoE)
        self.layers = nn.ModuleList([DecoderLayer(cfg, "full_attention", cfg.num_hidden_layers - 1)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache=None, meta: ForwardMeta | None = None) -> torch.Tensor:
        """emb: [B, T, hidden] embeddings of x_{j+k}; hidden: [B, T, hidden] a^{k-1}_j;
        positions: [B, T] int64 (j) -> a^k: [B, T, hidden]."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], -1))
        cos, sin = rope_cos_sin(positions, self.cfg.rotary_dim, self.cfg.rope_theta, x.dtype)
        return self.norm(self.layers[0](x, cos, sin, cache, meta))
