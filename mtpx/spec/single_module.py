"""Single-module MTP: draft module 0 applied num_speculative_tokens times (vLLM's `mtp` method with
one MTP layer; DeepSeek-V3 / Qwen3-Next serving).

Step 1 runs the module over every position the target computed since the last round (reading
x_{j+1} and h_j) and drafts d_1 from the last one. Step i >= 2 runs it at the single position
n - 2 + i on (d_{i-1}, its own previous output) and drafts d_i. The KV it writes at positions >= n
is transient: the next round's step 1 overwrites those positions before anything reads them, and
they are never published to the prefix cache (only positions < n are final).

The metadata of steps 2..k is built (and planned by the attention backend) before the loop, once
per engine step. `plan_decode` + `draft_loop` are the same round with static shapes for the
compiled decode step (mtpx/engine/compiled.py); `propose` is the general form (chunked prefill,
drafts sampled from the draft distribution).
"""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.models.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM
from mtpx.spec.common import gather_hidden, last_valid, run_module


class SingleModuleMTPSpeculator:
    """Drafts k tokens per step with MTP module 0 (module doc above).

    Raises ValueError when the model has no MTP module or num_speculative_tokens < 1.
    Lifecycle: allocate(cache) once per engine run, reset_rows(rows, start) for new or resumed
    requests, propose(...) after every target forward.
    num_lookahead_tokens = 1: the module's KV at position j depends on x_{j+1}, so a prefix-cache
    block is keyed on the token after it (KVCacheManager).
    """

    num_draft_modules = 1
    num_lookahead_tokens = 1

    def __init__(self, model: MTPForCausalLM, num_speculative_tokens: int | None = None):
        if len(model.mtp) < 1:
            raise ValueError("the model has no MTP module (num_nextn_predict_layers=0): "
                             "train one with mode=train or run without +spec")
        self.model = model
        self.k = 1 if num_speculative_tokens is None else int(num_speculative_tokens)
        if self.k < 1:
            raise ValueError("num_speculative_tokens must be >= 1")

    def allocate(self, cache: ModelCache) -> None:
        p = next(self.model.parameters())
        # module positions done per batch slot (+ the pad row)
        self.computed = torch.zeros(cache.rows + 1, dtype=torch.long, device=p.device)

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0) -> None:
        """New or resumed requests in `rows`: the module has computed positions [0, start)."""
        self.computed[rows] = torch.as_tensor(start, device=self.computed.device)

    def num_final(self, row: int, num_read_tokens: int) -> int:
        """Positions [0, P) whose module KV is final for the request in `row`, given that
        x_0 .. x_{num_read_tokens - 1} are committed and what the module read: computed, and
        reading no later token (its KV at j reads x_{j+1}; positions >= n are transient)."""
        return max(0, min(int(self.computed[row]), num_read_tokens - 1))

    @torch.no_grad()
    def propose(self, cache: ModelCache, rows: torch.Tensor, num_tokens: torch.Tensor,
                target_meta: ForwardMeta, target_hidden: torch.Tensor,
                draft: torch.Tensor | None = None, sampler=None) -> torch.Tensor:
        """rows: [B]; num_tokens: [B] known tokens per request (x_0..x_n, n = num_tokens - 1);
        target_meta/target_hidden [B, T, hidden]: the target's newly computed positions (all of them
        accepted); draft: [B] bool, False for a request in the middle of a chunked prefill (its
        module only catches up, num_tokens then counts its known prompt tokens); sampler:
        None (argmax drafts) or an mtpx.engine.sampler.DraftSampler. Returns drafts
        [B, k] int64 (zeros where draft is False), also written to cache.tokens[:, n+1 .. n+k]."""
        model = self.model
        draft = torch.ones_like(rows, dtype=torch.bool) if draft is None else draft
        n = num_tokens - 1
        end = torch.where(draft, n, torch.minimum(target_meta.ends, num_tokens - 1))
        start = torch.minimum(self.computed[rows], end)
        drafts = torch.zeros(rows.shape[0], self.k, dtype=torch.long, device=rows.device)
        if int((end - start).max()) <= 0:
            return drafts
        meta = cache.meta(start, end - start, rows)
        hidden = gather_hidden(meta, target_hidden, target_meta.positions[:, 0])
        a = last_valid(run_module(model, cache, 1, meta, hidden), meta)        # [B, hidden]
        self.computed[rows] = end
        if not bool(draft.any()):
            return drafts
        idx = draft.nonzero()[:, 0]
        rows, n, a = rows[idx], n[idx], a[idx]
        ones = torch.ones_like(n)
        metas = [cache.meta(n - 2 + i, ones, rows) for i in range(2, self.k + 1)]
        drafts[idx] = self._draft_steps(cache, rows, n, a, metas, sampler, idx)
        return drafts

    def _draft_steps(self, cache: ModelCache, rows: torch.Tensor, n: torch.Tensor, a: torch.Tensor,
                     metas: list[ForwardMeta], sampler=None, idx=None) -> torch.Tensor:
        """Steps 1..k from a = a^1_{n-1} [B, hidden]: step i >= 2 first runs the module at position
        n - 2 + i (metas[i - 2]) on (d_{i-1}, its previous output); every step drafts d_i from the
        module's latest output and writes it into cache.tokens[rows, n + i]. Returns [B, k] int64."""
        model, out = self.model, []
        for i in range(1, self.k + 1):
            if i > 1:  # position n-2+i reads d_{i-1} = x_{n+i-1} and the previous output
                m = metas[i - 2]
                emb = model.model.embed_tokens(out[-1][:, None])
                a = model.mtp[0](emb, a[:, None], m.positions, cache.draft[0], m)[:, 0]
            logits = model.draft_logits(0, a)
            d = logits.argmax(-1) if sampler is None else sampler(logits, idx, i - 1)
            cache.tokens[rows, n + i] = d
            out.append(d)
        return torch.stack(out, dim=1)

    # ---- the static-shape round (compiled decode step) -------------------------------------
    def plan_decode(self, cache: ModelCache, rows: torch.Tensor, num_tokens: torch.Tensor,
                    live: torch.Tensor, num_blocks: int) -> list[ForwardMeta]:
        """Before the draft loop, once per engine step: the static metadata of every module
        forward of a decode round, and the bookkeeping (computed) it implies.

        rows, num_tokens, live: [Bp] (a batch padded with cache.pad_row, live False for padding);
        every live request drafts, and the module's catch-up (positions computed .. n - 1, at most
        k + 1 after a verification) fits a window of k + 1. num_blocks: the block-table width all
        positions fit in. Returns [step 1 meta ([Bp, k + 1]), step 2..k metas ([Bp, 1])]."""
        n = num_tokens - 1
        start = torch.minimum(self.computed[rows], n)
        one = live.long()                                  # one token per live request, else none
        metas = [cache.static_meta(start, (n - start) * one, rows, self.k + 1, num_blocks)]
        metas += [cache.static_meta(n - 2 + i, one, rows, 1, num_blocks) for i in range(2, self.k + 1)]
        self.computed[rows] = torch.where(live, n, self.computed[rows])
        return metas

    def draft_loop(self, cache: ModelCache, metas: list[ForwardMeta], rows: torch.Tensor,
                   n: torch.Tensor, target_start: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
        """The whole draft loop of a decode round with static shapes (what engine.compile
        compiles): metas from plan_decode; rows, n (last known index), target_start (the
        verification window's first position): [Bp]; target_hidden: [Bp, k + 1, hidden], the
        target's hidden states over that window. Returns drafts [Bp, k] int64 (garbage for
        padding rows), also written to cache.tokens[rows, n+1 .. n+k]."""
        meta = metas[0]
        hidden = gather_hidden(meta, target_hidden, target_start)
        a = last_valid(run_module(self.model, cache, 1, meta, hidden), meta)      # [Bp, hidden]
        return self._draft_steps(cache, rows, n, a, metas[1:])
