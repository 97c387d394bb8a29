"""Single-module MTP: draft module 0 applied num_speculative_tokens times (vLLM's `mtp` method with
one MTP layer; DeepSeek-V3 / Qwen3-Next serving).

Step 1 runs the module over every position the target computed since the last round (reading
x_{j+1} and h_j) and drafts d_1 from the last one. Step i >= 2 runs it at the single position
n - 2 + i on (d_{i-1}, its own previous output) and drafts d_i. The KV it writes at positions >= n
is transient: the next round's step 1 overwrites those positions before anything reads them, and
they are never published to the prefix cache (only positions < n are final).

`plan` builds the metadata of every step of a round before the loop (static for the decode step,
dynamic after a prefill chunk); `draft_loop` runs them (mtpx/spec_decode/protocol.py).
"""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.attention.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM
from mtpx.spec_decode.common import gather_hidden, last_valid, module_meta, put_rows, run_module


class SingleModuleMTPSpeculator:
    """Drafts num_speculative_tokens per round with MTP module 0 (module doc). Raises ValueError
    when the model has no MTP module or num_speculative_tokens < 1. Implements Speculator
    (mtpx/spec_decode/protocol.py).

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
        self.num_speculative_tokens = 1 if num_speculative_tokens is None else int(num_speculative_tokens)
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")

    def allocate(self, cache: ModelCache) -> None:
        p = next(self.model.parameters())
        # module positions done per batch slot (+ the pad row)
        self.computed = torch.zeros(cache.rows + 1, dtype=torch.long, device=p.device)

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0, depth: int | None = None) -> None:
        """New or resumed requests in `rows`: the module has computed positions [0, start) (depth
        is ignored: the one module is always kept)."""
        self.computed[rows] = torch.as_tensor(start, device=self.computed.device)

    def set_depth(self, rows: torch.Tensor, depth: torch.Tensor) -> None:
        """Speculator.set_depth: nothing to stop (one module)."""

    def num_final(self, rows: torch.Tensor, num_read_tokens: torch.Tensor) -> torch.Tensor:
        """Computed, and reading no later token (its KV at j reads x_{j+1}; positions >= n are
        transient): P = min(computed, num_read_tokens - 1)."""
        return torch.minimum(self.computed[rows], num_read_tokens - 1).clamp(min=0)

    def persistent_buffers(self) -> list[torch.Tensor]:
        return [self.computed]

    def max_positions(self, num_window_tokens: int, num_drafts: int, num_prev_drafts: int) -> int:
        """Speculator.max_positions: step 1 covers the window's accepted tokens, the later steps
        one position each."""
        return num_window_tokens

    def plan(self, cache: ModelCache, rows: torch.Tensor, num_tokens: torch.Tensor,
             target_end: torch.Tensor, is_drafting: torch.Tensor,
             num_columns: int | None = None, num_blocks: int | None = None,
             num_drafts: int | torch.Tensor | None = None,
             num_modules: int | None = None) -> list[ForwardMeta]:
        """[step 1: the module over computed .. end - 1 (every position the target computed since
        the last round; at most num_speculative_tokens + 1 after a verification), steps 2..k: one
        position each for drafting rows] (steps 2..num_drafts only, when given: an int leaves the
        later steps out, a tensor gives them no token). Speculator.plan's contract."""
        n = num_tokens - 1
        end = torch.where(is_drafting, n, torch.minimum(target_end, n)).clamp(min=0)
        start = torch.minimum(self.computed[rows], end)
        static = num_columns is not None
        if not static and not bool((end > start).any()):
            return []
        metas = [module_meta(cache, start, end - start, rows, num_columns, num_blocks)]
        steps = self.num_speculative_tokens if not isinstance(num_drafts, int) else num_drafts
        if static or bool(is_drafting.any()):
            for i in range(2, steps + 1):        # one token per drafting row, none otherwise
                one = (is_drafting if num_drafts is None else is_drafting & (i <= num_drafts)).long()
                metas.append(module_meta(cache, n - 2 + i, one, rows, 1 if static else None, num_blocks))
        self.computed.index_copy_(0, rows, end)   # no broadcast: no guard on a batch != 1 (compiled)
        return metas

    def draft_loop(self, cache: ModelCache, metas: list[ForwardMeta], rows: torch.Tensor,
                   n: torch.Tensor, target_start: torch.Tensor, target_hidden: torch.Tensor,
                   sampler=None, num_drafts: int | None = None) -> torch.Tensor:
        """Speculator.draft_loop: step 1 drafts d_1 from the module's output at n - 1; step i >= 2
        first runs the module at position n - 2 + i on (d_{i-1}, its previous output). num_drafts
        0 (an int): step 1 only advances the module's KV, no draft."""
        model, k, B = self.model, self.num_speculative_tokens, rows.shape[0]
        if not metas:
            return torch.zeros(B, k, dtype=torch.long, device=rows.device)
        meta = metas[0]
        hidden = gather_hidden(meta, target_hidden, target_start)
        a = last_valid(run_module(model, cache, 1, meta, hidden), meta)        # [B, hidden]
        out = []
        last = 0 if isinstance(num_drafts, int) and num_drafts == 0 else len(metas)
        for i in range(1, last + 1):
            if i > 1:  # position n-2+i reads d_{i-1} = x_{n+i-1} and the previous output
                m = metas[i - 1]
                emb = model.model.embed_tokens(out[-1][:, None])
                a = model.mtp[0](emb, a[:, None], m.positions, cache.draft[0], m)[:, 0]
            logits = model.draft_logits(0, a)
            d = logits.argmax(-1) if sampler is None else sampler(logits, i - 1)
            put_rows(cache.tokens, rows, n + i, d)
            out.append(d)
        out += [torch.zeros_like(n)] * (k - len(out))
        return torch.stack(out, dim=1)
