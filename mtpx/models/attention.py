"""Full attention: Qwen3-Next's gated attention (Hugging Face `Qwen3NextAttention`) and, with
flags off, the plain attention of Llama (`LlamaAttention`) and Qwen3 (`Qwen3Attention`).

With `attn_output_gate`, q_proj emits, per head, a query and an output gate interleaved as
[head0: q(D) g(D), head1: ...] and the attention output is multiplied by sigmoid(gate) before
o_proj (Qiu et al. 2025, "Gated Attention for Large Language Models", arXiv 2505.06708). With
`use_qk_norm`, q and k get a per-head RMSNorm before RoPE (Qwen3, Qwen3-Next). Then (partial)
RoPE, grouped-query attention with scale head_dim^-0.5, o_proj.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from mtpx.attention.torch_backend import cached_attention, causal_attention
from mtpx.attention.kv_cache import KVCache
from mtpx.cache.state import KVCacheSpec
from mtpx.models import cpu_ops
from mtpx.models.config import ModelConfig
from mtpx.attention.meta import ForwardMeta
from mtpx.models.norm import RMSNorm
from mtpx.models.rope import apply_rope
from mtpx.models.linear import Linear


class GatedAttention(nn.Module):
    """(Gated) grouped-query attention; forward(x [B, T, hidden]) -> [B, T, hidden] (module doc)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.gated = cfg.attn_output_gate
        H, D, bias = self.num_heads, self.head_dim, cfg.attention_bias
        self.q_proj = Linear(cfg.hidden_size, H * D * (2 if self.gated else 1), bias=bias)
        self.k_proj = Linear(cfg.hidden_size, self.num_kv_heads * D, bias=bias)
        self.v_proj = Linear(cfg.hidden_size, self.num_kv_heads * D, bias=bias)
        self.o_proj = Linear(H * D, cfg.hidden_size, bias=bias)
        if cfg.use_qk_norm:
            self.q_norm = RMSNorm(D, cfg.rms_norm_eps, cfg.rms_norm_unit_offset)
            self.k_norm = RMSNorm(D, cfg.rms_norm_eps, cfg.rms_norm_unit_offset)
        else:
            self.q_norm = self.k_norm = nn.Identity()

    def cache_spec(self) -> KVCacheSpec:
        """What this layer needs cached: a paged KV cache (ModelCache builds it)."""
        return KVCacheSpec(self.num_heads, self.num_kv_heads, self.head_dim)

    def _fused_qk(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> bool:
        """Whether cpu_ops.qk_norm_rope runs the q / k norms and RoPE: cpu_ops.runs for q (float32
        CPU, eager inference), k and cos float32 CPU, cos of q's tokens with an even rotary dim
        within the head, and both norms RMSNorm of one eps and convention (or both absent)."""
        qn, kn = self.q_norm, self.k_norm
        if isinstance(qn, RMSNorm):
            if not (isinstance(kn, RMSNorm) and qn.eps == kn.eps and qn.unit_offset == kn.unit_offset
                    and all(w.dtype == torch.float32 and w.is_contiguous() for w in (qn.weight, kn.weight))):
                return False
        elif not (isinstance(qn, nn.Identity) and isinstance(kn, nn.Identity)):
            return False
        return (cos.shape[:-1] == q.shape[:-2] and cos.shape[-1] % 2 == 0 and cos.shape[-1] <= q.shape[-1]
                and k.dtype == cos.dtype == torch.float32
                and k.device.type == cos.device.type == "cpu" and cpu_ops.runs(q))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None = None, meta: ForwardMeta | None = None) -> torch.Tensor:
        """x: [B, T, hidden]; cos, sin: [B, T, rotary_dim] (x [N, hidden] and cos, sin [N,
        rotary_dim] when meta.packed: the projections run on the real tokens, the attention on
        the grid). Without a cache: causal over T."""
        lead = x.shape[:-1]
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        if self.gated:
            q, gate = self.q_proj(x).view(*lead, H, 2 * D).chunk(2, dim=-1)
        else:
            q = self.q_proj(x).view(*lead, H, D)
        k = self.k_proj(x).view(*lead, Hkv, D)
        v = self.v_proj(x).view(*lead, Hkv, D)
        if self._fused_qk(q, k, cos):      # the engine's eager CPU inference: one C call (cpu_ops)
            qn, kn = self.q_norm, self.k_norm
            q, k = (cpu_ops.qk_norm_rope(q, k, qn.weight, kn.weight, qn.eps, qn.unit_offset, cos, sin)
                    if isinstance(qn, RMSNorm)
                    else cpu_ops.qk_norm_rope(q, k, None, None, 0.0, False, cos, sin))
        else:
            q = apply_rope(self.q_norm(q), cos, sin)
            k = apply_rope(self.k_norm(k), cos, sin)
        packed = meta is not None and meta.packed is not None
        if packed:
            q, k, v = meta.unpack(q), meta.unpack(k), meta.unpack(v)
        if cache is None:
            out = causal_attention(q, k, v)
        elif meta.attn_backend is not None:
            out = meta.attn_backend.forward(q, k, v, cache, meta)
        else:
            out = cached_attention(q, k, v, cache, meta)
        out = (meta.pack(out) if packed else out).reshape(*lead, -1)
        if self.gated:
            out = out * torch.sigmoid(gate.reshape(*lead, -1))
        return self.o_proj(out)
