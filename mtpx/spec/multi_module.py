"""Multi-module MTP: module k drafts the k-th token and reads module k-1's hidden states.

Known tokens x_0..x_n, target hidden h_j for j <= n-1 (ARCHITECTURE.md, "MTP semantics"). Module k
at position j reads x_{j+k} and a^{k-1}_j, so at j = n-1 it reads draft d_{k-1} (k >= 2), and its KV
at positions j > n-k was computed from drafts. After verification accepts m of the drafts, those
positions whose draft was rejected hold stale KV: module k re-prefills from
    start_k = min(computed_k, n' - k)          (n' = the new last known index)
to n' - 1: besides the m + 1 new positions, the k - 1 - m stale ones (when positive), so at most
num_speculative_tokens - 1 re-prefilled positions (the re-prefill of the reference design,
shared/seeds/000_*). The a^{k-1} values it needs
at start_k that module k-1 does not recompute this round are kept in a per-position buffer: they
were computed from accepted tokens only, so they are final.
"""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.models.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM
from mtpx.spec.common import HiddenBuffer, last_valid, run_module


class MultiModuleMTPSpeculator:
    """Drafts k tokens per step, token i from MTP module i (module doc above); k defaults to the
    number of modules. Raises ValueError when k < 1, k > num_nextn_predict_layers, or the model has
    no MTP module. Same lifecycle as SingleModuleMTPSpeculator.
    """

    def __init__(self, model: MTPForCausalLM, num_speculative_tokens: int | None = None):
        num_modules = len(model.mtp)
        if num_modules < 1:
            raise ValueError("the model has no MTP module (num_nextn_predict_layers=0): "
                             "train some with mode=train or run without +spec")
        self.k = num_modules if num_speculative_tokens is None else int(num_speculative_tokens)
        if self.k < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if self.k > num_modules:
            raise ValueError(
                f"num_speculative_tokens={self.k} but the model has only {num_modules} MTP modules "
                f"(num_nextn_predict_layers): multi-module MTP drafts one token per module; set "
                f"spec.num_speculative_tokens<={num_modules} or use +spec=mtp1")
        self.model = model
        self.num_draft_modules = self.k

    def allocate(self, cache: ModelCache) -> None:
        p = next(self.model.parameters())
        self.hidden = HiddenBuffer(self.k, cache.rows, cache.max_len, self.model.cfg.hidden_size,
                                   p.dtype, p.device)
        self.computed = torch.zeros(cache.rows, self.k, dtype=torch.long, device=p.device)  # [rows, module]

    def reset_rows(self, rows: torch.Tensor) -> None:
        self.computed[rows] = 0

    @torch.no_grad()
    def propose(self, cache: ModelCache, rows: torch.Tensor, num_tokens: torch.Tensor,
                target_meta: ForwardMeta, target_hidden: torch.Tensor) -> torch.Tensor:
        """Same contract as SingleModuleMTPSpeculator.propose; returns drafts [B, k]."""
        self.hidden.write(0, target_meta, target_hidden)
        n = num_tokens - 1
        drafts = []
        for k in range(1, self.k + 1):
            start = torch.minimum(self.computed[rows, k - 1], n - k).clamp(min=0)
            meta = ForwardMeta.build(start, n - start, rows)
            a = run_module(self.model, cache, self.hidden, k, meta)           # [B, T, hidden]
            if k < self.k:
                self.hidden.write(k, meta, a)
            self.computed[rows, k - 1] = n
            d = self.model.lm_head(last_valid(a, meta)).argmax(-1)
            cache.tokens[rows, n + k] = d                                     # read by module k+1
            drafts.append(d)
        return torch.stack(drafts, dim=1)
