"""Partial rotary position embedding (RoPE, Su et al. 2021) as in Qwen3-Next.

Only the first `rotary_dim = head_dim * partial_rotary_factor` dims of each head are rotated, with
the "rotate_half" pairing (dim i with dim i + rotary_dim/2), as Hugging Face Llama/Qwen3-Next do.
"""
import torch


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """positions: [B, T] int64 -> (cos, sin), each [B, T, rotary_dim] in `dtype`.
    inv_freq[i] = theta ** (-2i / rotary_dim) (computed in float64 then cast)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64,
                                             device=positions.device) / rotary_dim))
    freqs = positions.to(torch.float64)[..., None] * inv_freq  # [B, T, rotary_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, sin: [B, T, R] with R <= D -> x with dims [:R] rotated."""
    r = cos.shape[-1]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat([x_rot * cos + _rotate_half(x_rot) * sin, x_pass], dim=-1)
