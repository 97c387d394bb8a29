"""Feed-forward blocks: SwiGLU MLP and Qwen3-Next's sparse MoE with a gated shared expert."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from mtpx.models import cpu_ops
from mtpx.models.config import ModelConfig
from mtpx.models.linear import Linear


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x)). x: [..., hidden] -> [..., hidden]."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if cpu_ops.runs(gate, other=up):       # the engine's eager CPU inference: one C call (cpu_ops)
            return self.down_proj(cpu_ops.silu_and_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)


class SparseMoE(nn.Module):
    """Top-k routed experts plus a shared expert scaled by sigmoid(shared_expert_gate(x)), as
    Hugging Face `Qwen3NextSparseMoeBlock`: router softmax in float32, top-k, optional
    renormalisation of the top-k weights (`norm_topk_prob`). x: [B, T, hidden] -> same shape."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(
            [MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts)])
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                          # [N, hidden]
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)        # [N, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)            # [N, k]
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        out = self._routed(x, weights.to(x.dtype), experts)
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape)

    @torch.compiler.disable
    def _routed(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """sum_k weights[:, k] * expert_{experts[:, k]}(x): x [N, hidden], weights, experts [N, k].
        Each expert runs on the tokens routed to it (data-dependent shapes), so under
        torch.compile this runs eager between graphs (engine.compile, mtpx/engine/compiled.py)."""
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.where(experts == e)
            if token_idx.numel():
                out.index_add_(0, token_idx, expert(x[token_idx]) * weights[token_idx, slot, None])
        return out


def build_mlp(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    if cfg.is_moe_layer(layer_idx):
        return SparseMoE(cfg)
    return MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
