"""Multi-module MTP: module k drafts the k-th token and reads module k-1's hidden states.

Known tokens x_0..x_n, target hidden h_j for j <= n-1 (docs/architecture.md, "MTP semantics"). Module k
at position j reads x_{j+k} and a^{k-1}_j, so at j = n-1 it reads draft d_{k-1} (k >= 2), and its KV
at positions j > n-k was computed from drafts. After verification accepts m of the drafts, those
positions whose draft was rejected hold stale KV: module k re-prefills from
    start_k = min(computed_k, n' - k)          (n' = the new last known index)
to n' - 1: besides the m + 1 new positions, the k - 1 - m stale ones (when positive), so at most
num_speculative_tokens - 1 re-prefilled positions (the re-prefill of the reference design,
docs/architecture.md). The a^{k-1} it needs at start_k that module k-1 does not recompute this round
(one position, n' - k) comes from a window of each module's last outputs: it was computed from
accepted tokens only, so it is final.

During a chunked prefill (rows that do not draft) module k advances over the positions whose inputs
are final, end_k = min(end_{k-1}, num_tokens - k) with end_0 the end of the target's chunk.

A row of depth d (Request.draft_depth, automatic k) runs modules 1..d only: the others never advance
for it, its KV is final where modules 1..d are (num_final), and it drafts at most d tokens.

`plan` builds every module's metadata of a round before the loop (static for the decode step,
dynamic after a prefill chunk); `propose` runs them and records each module's progress
(mtpx/spec_decode/protocol.py).
"""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.models.model import MTPForCausalLM
from mtpx.spec_decode.common import HiddenWindow, gather_hidden, last_valid, module_meta, put_rows, run_module
from mtpx.spec_decode.protocol import DraftBatch, DraftPlan, Drafts


class MultiModuleMTPSpeculator:
    """Drafts num_speculative_tokens per round, token i from MTP module i (module doc); the
    default is one per module. Raises ValueError when num_speculative_tokens < 1 or exceeds
    num_nextn_predict_layers, or the model has no MTP module. Implements Speculator
    (mtpx/spec_decode/protocol.py).

    num_lookahead_tokens = num_speculative_tokens: module k's KV at position j depends on tokens up
    to j + k, so a prefix-cache block is keyed on that many tokens after it (KVCacheManager).
    reprefill=False drafts without re-prefilling stale module KV (wrong drafts: for the tests that
    show the re-prefill is needed).
    """

    def __init__(self, model: MTPForCausalLM, num_speculative_tokens: int | None = None,
                 reprefill: bool = True):
        num_modules = len(model.mtp)
        if num_modules < 1:
            raise ValueError("the model has no MTP module (num_nextn_predict_layers=0): "
                             "train some with mode=train or run without +spec")
        k = num_modules if num_speculative_tokens is None else int(num_speculative_tokens)
        if k < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if k > num_modules:
            raise ValueError(
                f"num_speculative_tokens={k} but the model has only {num_modules} MTP modules "
                f"(num_nextn_predict_layers): multi-module MTP drafts one token per module; set "
                f"spec.num_speculative_tokens<={num_modules} or use +spec=mtp1")
        self.model, self.reprefill = model, reprefill
        self.num_speculative_tokens = self.num_draft_modules = self.num_lookahead_tokens = k

    def allocate(self, cache: ModelCache) -> None:
        p = next(self.model.parameters())
        k = self.num_speculative_tokens
        # batch slots + ModelCache's pad row
        self.window = HiddenWindow(k - 1, cache.rows + 1, k + 1, self.model.cfg.hidden_size,
                                   p.dtype, p.device)
        self.computed = torch.zeros(cache.rows + 1, k, dtype=torch.long, device=p.device)  # [rows, module]
        self.buffers = [self.computed, *self.window.buf]

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0) -> None:
        """New requests in `rows` (or resumed after preemption): their modules have computed
        positions [0, start) (start > 0 after a prefix-cache hit)."""
        self.computed[rows] = torch.as_tensor(start, device=self.computed.device)[..., None]

    def hold(self, rows: torch.Tensor, depth: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
        """Speculator.hold: module k's positions j + k >= num_tokens - 1 read a draft that the step's
        verification rejected or replaced (the re-prefill's rule, module doc): they count as not
        computed, computed_k = min(computed_k, num_tokens - 1 - k), for k <= the row's depth."""
        k = torch.arange(1, self.num_speculative_tokens + 1, device=rows.device)[None]
        valid = (num_tokens[:, None] - 1 - k).clamp(min=0)
        computed = self.computed[rows]
        put_rows(self.computed, rows[:, None].expand_as(computed), (k - 1).expand_as(computed),
                 torch.where(k <= depth[:, None], torch.minimum(computed, valid), computed))
        return self._num_final(rows, depth, num_tokens)

    def _num_final(self, rows: torch.Tensor, depth: torch.Tensor,
                   num_read_tokens: torch.Tensor) -> torch.Tensor:
        """Drafts.num_final: module k's KV at j is final iff computed (j < computed_k) and it read
        no later token (j + k < num_read_tokens): P = min(min_{k <= d} computed_k,
        num_read_tokens - d) for a row of depth d."""
        kept = torch.arange(self.num_speculative_tokens, device=rows.device)[None] < depth[:, None]
        computed = torch.where(kept, self.computed[rows], num_read_tokens[:, None]).min(1).values
        return torch.minimum(computed, num_read_tokens - depth).clamp(min=0)

    def plan(self, cache: ModelCache, batch: DraftBatch) -> DraftPlan:
        """Module k covers start_k .. end_k - 1 (module doc): a drafting row re-prefills from
        min(computed_k, n - k) to n - 1 (at most num_speculative_tokens + 1 positions after a
        verification); the others catch up. In a drafting row the module after its drafts
        (DraftBatch.drafts) runs to n - 1 too (its last input is the last draft; no logits), so a round
        drafting one more needs no catch-up (common.max_module_positions); the later ones catch
        up to n - k, over its re-prefill start (their stale positions are redone). Modules
        beyond a row's depth cover nothing. Speculator.plan's contract."""
        plan = DraftPlan([], [])
        for start, end in module_bounds(self, batch):
            if batch.num_columns is None and not bool((end > start).any()):
                break                        # dynamic: this module and the later ones idle
            plan.metas.append(module_meta(cache, start, end - start, batch.rows, batch.num_columns,
                                          batch.num_blocks))
            plan.computed.append(end)
        return plan

    def propose(self, cache: ModelCache, batch: DraftBatch, plan: DraftPlan | None = None) -> Drafts:
        """Speculator.propose: module k reads module k-1's outputs of this round (or, before
        their start, of earlier rounds from the window) and drafts d_k (modules after the first
        num_drafts, an int, draw no logits)."""
        b, model = batch, self.model
        plan = self.plan(cache, b) if plan is None else plan
        limit = b.num_drafts if isinstance(b.num_drafts, int) else None
        n = b.num_tokens - 1
        prev, prev_start = b.target_hidden, b.target_start[:, None]
        drafts, outs = [], []
        for module, meta in enumerate(plan.metas, start=1):
            a = run_module(model, cache, module, meta,
                           gather_hidden(meta, prev, prev_start, self.window, module - 1))
            if limit is None or module <= limit:
                logits = model.draft_logits(module - 1, last_valid(a, meta))
                d = logits.argmax(-1) if b.sampler is None else b.sampler(logits, module - 1)
                cache.write_tokens(b.rows, n + module, d)                  # read by module k+1
                drafts.append(d)
            outs.append(a)
            prev, prev_start = a, meta.positions[:, :1]     # [B, 1]: gather_hidden
        for module, (meta, a, end) in enumerate(zip(plan.metas, outs, plan.computed), start=1):
            if module < self.num_speculative_tokens:   # after every module read the window
                self.window.write(module, meta, a)
            put_rows(self.computed, b.rows, torch.full_like(b.rows, module - 1), end)
        drafts += [torch.zeros_like(n)] * (self.num_speculative_tokens - len(drafts))
        return Drafts(torch.stack(drafts, dim=1), getattr(b.sampler, "q", None),
                      self._num_final(b.rows, b.depth, b.num_tokens))


def module_bounds(spec: MultiModuleMTPSpeculator, batch: DraftBatch
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(start_k, end_k) [B] int64 of every module of `spec`'s round, k = 1 .. (`plan`'s rule, none
    left out: tree drafting runs a module over its nodes even where its catch-up is empty)."""
    b = batch
    n = b.num_tokens - 1
    end = b.target_end
    drafted = b.depth if b.drafts is None else b.drafts
    out = []
    last = spec.num_speculative_tokens if b.num_modules is None else b.num_modules
    for module in range(1, last + 1):
        kept = module <= b.depth
        computed = spec.computed[b.rows, module - 1]
        end = torch.where(b.is_drafting & (module <= drafted + 1), n,
                          torch.minimum(end, b.num_tokens - module)).clamp(min=0)
        end = torch.where(kept, end, computed)
        redo = torch.minimum(computed, n - module) if spec.reprefill else computed
        start = torch.where(b.is_drafting & kept, redo, computed).clamp(min=0)
        out.append((torch.minimum(start, end), end))
    return out
