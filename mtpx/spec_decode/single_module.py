"""Single-module MTP: draft module 0 applied num_speculative_tokens times (vLLM's `mtp` method with
one MTP layer; DeepSeek-V3 / Qwen3-Next serving).

Step 1 runs the module over every position the target computed since the last round (reading
x_{j+1} and h_j) and drafts d_1 from the last one. Step i >= 2 runs it at the single position
n - 2 + i on (d_{i-1}, its own previous output) and drafts d_i. The KV it writes at positions >= n
is transient: the next round's step 1 overwrites those positions before anything reads them, and
they are never published to the prefix cache (only positions < n are final).

`plan` builds the metadata of every step of a round before the loop (static for the decode step,
dynamic after a prefill chunk); `propose` runs them and records the module's progress
(mtpx/spec_decode/protocol.py).
"""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.models.model import MTPForCausalLM
from mtpx.spec_decode.common import gather_hidden, last_valid, module_meta, run_module
from mtpx.spec_decode.protocol import DraftBatch, DraftPlan, Drafts


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
        self.buffers = [self.computed]

    def reset_rows(self, rows: torch.Tensor, start: torch.Tensor | int = 0) -> None:
        """New or resumed requests in `rows`: the module has computed positions [0, start)."""
        self.computed[rows] = torch.as_tensor(start, device=self.computed.device)

    def hold(self, rows: torch.Tensor, depth: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
        """Speculator.hold: the module's positions below `computed` read only known tokens (those
        of a round's steps 2..k are transient and never counted), so nothing is marked; num_final
        as `propose`'s."""
        return torch.minimum(self.computed[rows], num_tokens - 1).clamp(min=0)

    def plan(self, cache: ModelCache, batch: DraftBatch) -> DraftPlan:
        """[step 1: the module over computed .. end - 1 (every position the target computed since
        the last round; at most num_speculative_tokens + 1 after a verification), steps 2..k: one
        position each for drafting rows] (steps 2..num_drafts only, when given: an int leaves the
        later steps out, a tensor gives them no token). Speculator.plan's contract."""
        b = batch
        n = b.num_tokens - 1
        end = torch.where(b.is_drafting, n, torch.minimum(b.target_end, n)).clamp(min=0)
        start = torch.minimum(self.computed[b.rows], end)
        static = b.num_columns is not None
        if not static and not bool((end > start).any()):
            return DraftPlan([], [])
        plan = DraftPlan([module_meta(cache, start, end - start, b.rows, b.num_columns, b.num_blocks)], [end])
        steps = self.num_speculative_tokens if not isinstance(b.num_drafts, int) else b.num_drafts
        if static or bool(b.is_drafting.any()):
            for i in range(2, steps + 1):        # one token per drafting row, none otherwise
                one = (b.is_drafting if b.num_drafts is None else b.is_drafting & (i <= b.num_drafts)).long()
                columns = 1 if static else None
                plan.metas.append(module_meta(cache, n - 2 + i, one, b.rows, columns, b.num_blocks))
        return plan

    def propose(self, cache: ModelCache, batch: DraftBatch, plan: DraftPlan | None = None) -> Drafts:
        """Speculator.propose: step 1 drafts d_1 from the module's output at n - 1; step i >= 2
        first runs the module at position n - 2 + i on (d_{i-1}, its previous output).
        num_drafts 0 (an int): step 1 only advances the module's KV, no draft. num_final: the
        module's KV at j reads x_{j+1}, and positions >= n are transient: min(computed,
        num_tokens - 1)."""
        b, model, k = batch, self.model, self.num_speculative_tokens
        plan = self.plan(cache, b) if plan is None else plan
        n = b.num_tokens - 1
        out = []
        if plan.metas:
            meta = plan.metas[0]
            hidden = gather_hidden(meta, b.target_hidden, b.target_start[:, None])
            a = last_valid(run_module(model, cache, 1, meta, hidden), meta)        # [B, hidden]
            last = 0 if isinstance(b.num_drafts, int) and b.num_drafts == 0 else len(plan.metas)
            for i in range(1, last + 1):
                if i > 1:  # position n-2+i reads d_{i-1} = x_{n+i-1} and the previous output
                    m = plan.metas[i - 1]
                    emb = model.model.embed_tokens(out[-1][:, None])
                    a = model.mtp[0](emb, a[:, None], m.positions, cache.draft[0], m)[:, 0]
                logits = model.draft_logits(0, a)
                d = logits.argmax(-1) if b.sampler is None else b.sampler(logits, i - 1)
                cache.write_tokens(b.rows, n + i, d)
                out.append(d)
            self.computed.index_copy_(0, b.rows, plan.computed[0])   # no broadcast: no guard on a batch != 1
        out += [torch.zeros_like(n)] * (k - len(out))
        num_final = torch.minimum(self.computed[b.rows], n).clamp(min=0)
        return Drafts(torch.stack(out, dim=1), getattr(b.sampler, "q", None), num_final)
