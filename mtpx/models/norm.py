"""RMSNorm variants used by Qwen3-Next-style models.

`RMSNorm` follows Qwen3-Next's zero-centred convention (Hugging Face `Qwen3NextRMSNorm`) by default:
the weight is initialised to 0 and the output is `x / rms(x) * (1 + weight)`, computed in float32.
With `unit_offset=False` it is Llama's / Qwen3's `LlamaRMSNorm`: weight initialised to 1, output
`weight * (x / rms(x))` cast to x's dtype first.
`RMSNormGated` is the output norm of Gated DeltaNet (`Qwen3NextRMSNormGated`): `x / rms(x) * weight
* silu(gate)`, weight initialised to 1.
In the engine's eager CPU inference, RMSNorm runs as one C call (mtpx/models/cpu_ops.py).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from mtpx.models import cpu_ops


class RMSNorm(nn.Module):
    """RMSNorm over the last dim (module doc: zero-centred, or standard with unit_offset=False).
    x: [..., dim] any float dtype -> same shape and dtype."""

    def __init__(self, dim: int, eps: float = 1e-6, unit_offset: bool = True):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_ops.runs(x, self.weight):
            return cpu_ops.rms_norm(x, self.weight, self.eps, self.unit_offset)[1]
        return self._reference(x)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(s, norm(s)) with s = x + residual, the pre-norm block's residual add and the next
        norm (one C call where the kernel runs). x, residual: [..., dim], same shape and dtype."""
        if cpu_ops.runs(x, self.weight, residual):
            return cpu_ops.rms_norm(x, self.weight, self.eps, self.unit_offset, residual)
        s = x + residual
        return s, self._reference(s)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (y * (1.0 + self.weight.to(y.dtype))).to(dtype)
        return self.weight * y.to(dtype)


class RMSNormGated(nn.Module):
    """RMSNorm followed by a SiLU gate. x, gate: [..., dim] -> [..., dim] in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight.to(y.dtype) * y
        return (y * F.silu(gate.to(y.dtype))).to(dtype)
