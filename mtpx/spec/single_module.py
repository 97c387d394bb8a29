"""Single-module MTP: draft module 0 applied num_speculative_tokens times (vLLM's `mtp` method with
one MTP layer; DeepSeek-V3 / Qwen3-Next serving).

Step 1 runs the module over every position the target computed since the last round (reading
x_{j+1} and h_j) and drafts d_1 from the last one. Step i >= 2 runs it at the single position
n - 2 + i on (d_{i-1}, its own previous output) and drafts d_i. The KV it writes at positions >= n
is transient: the next round's step 1 overwrites those positions before anything reads them.
"""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.models.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM
from mtpx.spec.common import HiddenBuffer, last_valid, run_module


class SingleModuleMTPSpeculator:
    """Drafts k tokens per step with MTP module 0 (module doc above).

    Raises ValueError when the model has no MTP module or num_speculative_tokens < 1.
    Lifecycle: allocate(cache) once per engine run, reset_rows(rows) for new requests,
    propose(...) after every target forward.
    """

    num_draft_modules = 1

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
        self.hidden = HiddenBuffer(1, cache.rows, cache.max_len, self.model.cfg.hidden_size,
                                   p.dtype, p.device)
        self.computed = torch.zeros(cache.rows, dtype=torch.long, device=p.device)  # module positions done per row

    def reset_rows(self, rows: torch.Tensor) -> None:
        self.computed[rows] = 0

    @torch.no_grad()
    def propose(self, cache: ModelCache, rows: torch.Tensor, num_tokens: torch.Tensor,
                target_meta: ForwardMeta, target_hidden: torch.Tensor) -> torch.Tensor:
        """rows: [B]; num_tokens: [B] known tokens per request (x_0..x_n, n = num_tokens - 1);
        target_meta/target_hidden [B, T, hidden]: the target's newly computed positions (all of them
        accepted). Returns drafts [B, k] int64, also written to cache.tokens[:, n+1 .. n+k]."""
        model = self.model
        self.hidden.write(0, target_meta, target_hidden)
        n = num_tokens - 1
        start = self.computed[rows]
        meta = ForwardMeta.build(start, n - start, rows)
        a = last_valid(run_module(model, cache, self.hidden, 1, meta), meta)   # [B, hidden]
        self.computed[rows] = n
        drafts = []
        for i in range(1, self.k + 1):
            if i > 1:  # position n-2+i reads d_{i-1} = x_{n+i-1} and the previous output
                pos = n - 2 + i
                step_meta = ForwardMeta.build(pos, torch.ones_like(pos), rows)
                emb = model.model.embed_tokens(drafts[-1][:, None])
                a = model.mtp[0](emb, a[:, None], step_meta.positions, cache.draft[0], step_meta)[:, 0]
            d = model.lm_head(a).argmax(-1)
            cache.tokens[rows, n + i] = d
            drafts.append(d)
        return torch.stack(drafts, dim=1)
