"""Multi-module MTP: module k drafts the k-th token and reads module k-1's hidden states.

Known tokens x_0..x_n, target hidden h_j for j <= n-1 (ARCHITECTURE.md, "MTP semantics"). Module k
at position j reads x_{j+k} and a^{k-1}_j, so at j = n-1 it reads draft d_{k-1} (k >= 2), and its KV
at positions j > n-k was computed from drafts. After verification accepts m of the drafts, those
positions whose draft was rejected hold stale KV: module k re-prefills from
    start_k = min(computed_k, n' - k)          (n' = the new last known index)
to n' - 1: besides the m + 1 new positions, the k - 1 - m stale ones (when positive), so at most
num_speculative_tokens - 1 re-prefilled positions (the re-prefill of the reference design,
shared/seeds/000_*). The a^{k-1} it needs at start_k that module k-1 does not recompute this round
(one position, n' - k) comes from a window of each module's last outputs: it was computed from
accepted tokens only, so it is final.

During a chunked prefill (rows with draft=False) nothing is drafted: module k advances over the
positions whose inputs are final, end_k = min(end_{k-1}, num_tokens - k) with end_0 the end of the
target's chunk.

`plan_decode` + `draft_loop` are a decode round with static shapes for the compiled decode step
(mtpx/engine/compiled.py): every module's metadata is built (and planned) before the loop, once per
engine step; `propose` is the general form (chunked prefill, sampled drafts).
"""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.models.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM
from mtpx.spec.common import HiddenWindow, gather_hidden, last_valid, run_module


class MultiModuleMTPSpeculator:
    """Drafts k tokens per step, token i from MTP module i (module doc above); k defaults to the
    number of modules. Raises ValueError when k < 1, k > num_nextn_predict_layers, or the model has
    no MTP module. Same lifecycle as SingleModuleMTPSpeculator.

    num_lookahead_tokens = k: module k's KV at position j depends on tokens up to j + k, so a
    prefix-cache block is keyed on the k tokens after it (KVCacheManager).
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
        self.num_lookahead_tokens = self.k

    def allocate(self, cache: ModelCache) -> None:
        p = next(self.model.parameters())
        # batch slots + ModelCache's pad row
        self.window = HiddenWindow(self.k - 1, cache.rows + 1, self.k + 1, self.model.cfg.hidden_size,
                                   p.dtype, p.device)
        self.computed = torch.zeros(cache.rows + 1, self.k, dtype=torch.long, device=p.device)  # [rows, module]

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0) -> None:
        """New requests in `rows` (or resumed after preemption): their modules have computed
        positions [0, start) (start > 0 after a prefix-cache hit)."""
        self.computed[rows] = torch.as_tensor(start, device=self.computed.device)[..., None]

    def num_final(self, row: int, num_read_tokens: int) -> int:
        """Positions [0, P) whose KV is final in every module for the request in `row`, given that
        x_0 .. x_{num_read_tokens - 1} are committed tokens and what the modules read there.

        Module k's KV at j is final iff computed (j < computed_k) and it read no later token
        (j + k < num_read_tokens): P = min(min_k computed_k, num_read_tokens - num_speculative_tokens).
        Running requests pass their token count (the re-prefill repaired what read a rejected
        draft); a request ending right after a verification that emitted a bonus token passes one
        less: its modules read the rejected draft there and will never re-prefill."""
        return max(0, min(int(self.computed[row].min()), num_read_tokens - self.k))

    @torch.no_grad()
    def propose(self, cache: ModelCache, rows: torch.Tensor, num_tokens: torch.Tensor,
                target_meta: ForwardMeta, target_hidden: torch.Tensor,
                draft: torch.Tensor | None = None, sampler=None) -> torch.Tensor:
        """Same contract as SingleModuleMTPSpeculator.propose; returns drafts [B, k]."""
        model = self.model
        draft = torch.ones_like(rows, dtype=torch.bool) if draft is None else draft
        n = num_tokens - 1
        prev, prev_start, end = target_hidden, target_meta.positions[:, 0], target_meta.ends
        drafts = torch.zeros(rows.shape[0], self.k, dtype=torch.long, device=rows.device)
        ran = []
        for k in range(1, self.k + 1):
            end = torch.where(draft, n, torch.minimum(end, num_tokens - k))
            computed = self.computed[rows, k - 1]
            start = torch.where(draft, torch.minimum(computed, n - k), computed).clamp(min=0)
            start = torch.minimum(start, end)
            if int((end - start).max()) <= 0:
                break
            meta = cache.meta(start, end - start, rows)
            a = run_module(model, cache, k, meta, gather_hidden(meta, prev, prev_start, self.window, k - 1))
            ran.append((k, meta, a))
            self.computed[rows, k - 1] = end
            if bool(draft.any()):
                logits = model.draft_logits(k - 1, last_valid(a, meta))
                d = (logits.argmax(-1) if sampler is None
                     else sampler(logits, torch.arange(rows.shape[0], device=rows.device), k - 1))
                drafts[:, k - 1] = torch.where(draft, d, 0)
                cache.tokens[rows[draft], (n + k)[draft]] = d[draft]           # read by module k+1
            prev, prev_start = a, start
        for k, meta, a in ran:  # after every module has read this round's inputs
            if k < self.k:
                self.window.write(k, meta, a)
        return drafts

    # ---- the static-shape round (compiled decode step) -------------------------------------
    def plan_decode(self, cache: ModelCache, rows: torch.Tensor, num_tokens: torch.Tensor,
                    live: torch.Tensor, num_blocks: int) -> list[ForwardMeta]:
        """Before the draft loop, once per engine step: the static metadata of modules 1..k
        ([Bp, k + 1] each: module k covers start_k .. n - 1, max(m + 1, k) <= k + 1 positions after
        a verification that accepted m) and the bookkeeping it implies. Arguments as
        SingleModuleMTPSpeculator.plan_decode."""
        n = num_tokens - 1
        live_l = live.long()
        metas = []
        for k in range(1, self.k + 1):
            start = torch.minimum(self.computed[rows, k - 1], n - k).clamp(min=0)
            metas.append(cache.static_meta(start, (n - start) * live_l, rows, self.k + 1, num_blocks))
            self.computed[rows, k - 1] = torch.where(live, n, self.computed[rows, k - 1])
        return metas

    def draft_loop(self, cache: ModelCache, metas: list[ForwardMeta], rows: torch.Tensor,
                   n: torch.Tensor, target_start: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
        """The whole draft loop of a decode round with static shapes (what engine.compile
        compiles); same contract as SingleModuleMTPSpeculator.draft_loop."""
        model = self.model
        prev, prev_start = target_hidden, target_start
        drafts, outs = [], []
        for k, meta in enumerate(metas, start=1):
            a = run_module(model, cache, k, meta, gather_hidden(meta, prev, prev_start, self.window, k - 1))
            d = model.draft_logits(k - 1, last_valid(a, meta)).argmax(-1)
            cache.tokens[rows, n + k] = d                                   # read by module k+1
            drafts.append(d)
            outs.append(a)
            prev, prev_start = a, meta.positions[:, 0]
        for k in range(1, self.k):  # after every module has read this round's inputs
            self.window.write(k, metas[k - 1], outs[k - 1])
        return torch.stack(drafts, dim=1)
