"""Single-module MTP: draft module 0 applied num_speculative_tokens times (vLLM's `mtp` method with
one MTP layer; DeepSeek-V3 / Qwen3-Next serving).

Step 1 runs the module over every position the target computed since the last round (reading
x_{j+1} and h_j) and drafts d_1 from the last one. Step i >= 2 runs it at the single position
n - 2 + i on (d_{i-1}, its own previous output) and drafts d_i. The KV it writes at positions >= n
is transient: the next round's step 1 overwrites those positions before anything reads them, and
they are never published to the prefix cache (only positions < n are final).
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
    num_lookahead_tokens = 1: the module's KV at position j depends on x_{j+1}.
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
        self.computed = torch.zeros(cache.rows, dtype=torch.long, device=p.device)  # module positions done per row

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0) -> None:
        """New or resumed requests in `rows`: the module has computed positions [0, start)."""
        self.computed[rows] = torch.as_tensor(start, device=self.computed.device)

    def num_computed(self, row: int) -> int:
        """Positions [0, n) the module has computed for the request in `row`."""
        return int(self.computed[row])

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
        out = []
        for i in range(1, self.k + 1):
            if i > 1:  # position n-2+i reads d_{i-1} = x_{n+i-1} and the previous output
                step_meta = cache.meta(n - 2 + i, torch.ones_like(n), rows)
                emb = model.model.embed_tokens(out[-1][:, None])
                a = model.mtp[0](emb, a[:, None], step_meta.positions, cache.draft[0], step_meta)[:, 0]
            logits = model.draft_logits(0, a)
            d = logits.argmax(-1) if sampler is None else sampler(logits, idx, i - 1)
            cache.tokens[rows, n + i] = d
            out.append(d)
        drafts[idx] = torch.stack(out, dim=1)
        return drafts
