"""What both MTP speculators share: the target-hidden buffer and one batched module forward."""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.models.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM


class HiddenBuffer:
    """Per-position hidden states a^k of each request row: buf[k]: [rows, max_len, hidden].
    Level 0 holds the target's hidden states h; level k the output of draft module k."""

    def __init__(self, levels: int, rows: int, max_len: int, hidden: int, dtype, device):
        self.buf = [torch.zeros(rows, max_len, hidden, dtype=dtype, device=device)
                    for _ in range(levels)]

    def write(self, level: int, meta: ForwardMeta, values: torch.Tensor) -> None:
        """values: [B, T, hidden] at meta's positions/rows; padding entries are skipped."""
        B, T = meta.valid.shape
        rows = meta.rows[:, None].expand(B, T)[meta.valid]
        self.buf[level][rows, meta.positions[meta.valid]] = values[meta.valid]

    def read(self, level: int, meta: ForwardMeta) -> torch.Tensor:
        """-> [B, T, hidden], the values at meta's rows and positions."""
        return self.buf[level][meta.rows[:, None], meta.positions]        # [B, T, hidden]


def run_module(model: MTPForCausalLM, cache: ModelCache, hidden: HiddenBuffer, k: int,
               meta: ForwardMeta) -> torch.Tensor:
    """Draft module k (1-based) over meta's positions j: reads token x_{j+k} from the token buffer and
    a^{k-1}_j from level k-1 of `hidden`; writes its KV into cache.draft[k-1].
    Returns a^k [B, T, hidden]."""
    tokens = cache.tokens[meta.rows[:, None], meta.positions + k]         # [B, T]
    emb = model.model.embed_tokens(tokens)
    return model.mtp[k - 1](emb, hidden.read(k - 1, meta), meta.positions, cache.draft[k - 1], meta)


def last_valid(x: torch.Tensor, meta: ForwardMeta) -> torch.Tensor:
    """x: [B, T, ...] -> the entry at each request's last real token, [B, ...]."""
    return x[torch.arange(x.shape[0], device=x.device), meta.lengths - 1]
