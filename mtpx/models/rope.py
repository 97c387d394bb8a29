"""Partial rotary position embedding (RoPE, Su et al. 2021) as in Qwen3-Next, Llama and Qwen3.

Only the first `rotary_dim = head_dim * partial_rotary_factor` dims of each head are rotated, with
the "rotate_half" pairing (dim i with dim i + rotary_dim/2), as Hugging Face Llama/Qwen3-Next do.
Frequency scaling (`rope_scaling`) follows Hugging Face's `ROPE_INIT_FUNCTIONS`: "linear" divides
every frequency by `factor`; "llama3" (Llama 3.1) divides low frequencies by `factor`, keeps high
ones and interpolates in between.
"""
import math

import torch


def rope_inv_freq(rotary_dim: int, theta: float, scaling: dict | None = None,
                  device=None) -> torch.Tensor:
    """inv_freq[i] = theta ** (-2i / rotary_dim), then `scaling` (module doc): [rotary_dim/2] float64.

    Raises ValueError for a scaling type other than default, linear, llama3."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64,
                                             device=device) / rotary_dim))
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_scaling type '{kind}' is not supported: use default, linear or llama3")


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype,
                 scaling: dict | None = None):
    """positions: [B, T] int64 -> (cos, sin), each [B, T, rotary_dim] in `dtype`, from
    `rope_inv_freq` (computed in float64 then cast)."""
    inv_freq = rope_inv_freq(rotary_dim, theta, scaling, positions.device)
    freqs = positions.to(torch.float64)[..., None] * inv_freq  # [B, T, rotary_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., H, D]; cos, sin: [..., R] with R <= D (the same leading dims: [B, T] or the
    packed [N]) -> x with dims [:R] rotated."""
    r = cos.shape[-1]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat([x_rot * cos + _rotate_half(x_rot) * sin, x_pass], dim=-1)
