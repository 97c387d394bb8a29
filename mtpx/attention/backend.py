"""The attention backend interface: how a cached attention layer reads and writes the paged KV.

A backend is chosen per engine (`engine.attention_backend`) and planned once per forward: every
attention layer of that forward (the target's, or one draft module's) shares one plan, as vLLM's
attention metadata is built once per step and read by every layer.

    backend.plan(meta)  -> a plan object (or None), stored as meta.attn_plan
    backend.forward(q, k, v, cache, meta) -> out

q [B, T, H, D] and k, v [B, T, Hkv, D] are the new tokens of a right-padded grid (meta.valid marks
the real ones); forward writes k, v of the valid tokens at meta.slot_mapping into `cache` (a
`mtpx.cache.state.KVCache`, [num_blocks, block_size, Hkv, D] per tensor) and returns the causal
attention of each query over its request's positions 0 .. its own position: [B, T, H, D] (padding
queries return garbage that callers never read).

Implementations: "torch" (mtpx/attention/torch_backend.py, CPU and GPU, the reference) and
"flashinfer" (mtpx/attention/flashinfer_backend.py, CUDA only).
"""
from __future__ import annotations

from typing import Protocol

import torch

ATTENTION_BACKENDS = ("torch", "flashinfer")


class AttentionBackend(Protocol):
    name: str

    def plan(self, meta) -> object | None:
        """Per-forward metadata computed once before the layers run (FlashInfer's plan())."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, meta) -> torch.Tensor:
        """Write the new k, v into the paged cache and attend (module doc)."""


def get_backend(name: str, device: torch.device, attention_shape: tuple | None = None) -> AttentionBackend:
    """The backend `name` for tensors on `device`; attention_shape: (num_heads, num_kv_heads,
    head_dim, dtype) of the model's attention layers, which lets FlashInfer plan at plan() time.

    Raises ValueError for an unknown name, or "flashinfer" off CUDA or without the flashinfer
    package (the message names the fix: engine.attention_backend=torch, or the install command).
    """
    if name == "torch":
        from mtpx.attention.torch_backend import TorchBackend
        return TorchBackend()
    if name == "flashinfer":
        if device.type != "cuda":
            raise ValueError(f"engine.attention_backend=flashinfer needs a CUDA device (the model is on "
                             f"{device}): use engine.attention_backend=torch")
        try:
            from mtpx.attention.flashinfer_backend import FlashInferBackend
        except ImportError as err:
            raise ValueError(f"engine.attention_backend=flashinfer needs the flashinfer package ({err}): "
                             "pip install -e '.[gpu]', or use engine.attention_backend=torch") from None
        return FlashInferBackend(device, attention_shape)
    raise ValueError(f"unknown engine.attention_backend '{name}': "
                     f"choose one of {', '.join(ATTENTION_BACKENDS)}")
