"""The decoding engine: admits requests into batch slots, prefills them, and runs verification +
drafting steps over all running requests until every one finishes.

One step (ARCHITECTURE.md, "Data flow"): prefill newly admitted requests -> target forward over each
running request's verification window [x_n, d_1..d_k] (keeping the Gated DeltaNet state after every
token) -> greedy verification (accept the longest prefix of drafts equal to the target's argmax, plus
the target's next token) -> select the recurrent state at the accepted position -> the speculator
drafts the next tokens. Without a speculator the window is [x_n] and this is plain greedy decoding.
"""
from __future__ import annotations

import time
from collections import deque

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.engine.request import Request
from mtpx.models.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM
from mtpx.spec.common import last_valid


class Engine:
    """model: the target with its MTP modules; speculator: None (plain decoding) or an MTP
    speculator; max_num_seqs: batch slots; max_model_len: positions per request (prompt + output);
    record_logit_gaps: keep the top-2 logit gap of every emitted token (near-tie analysis)."""

    def __init__(self, model: MTPForCausalLM, speculator=None, max_num_seqs: int = 64,
                 max_model_len: int | None = None, record_logit_gaps: bool = False):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs}: need at least one batch slot "
                             "(eval.concurrency >= 1)")
        limit = model.cfg.max_position_embeddings
        max_model_len = limit if max_model_len is None else max_model_len
        if not 2 <= max_model_len <= limit:
            raise ValueError(f"max_model_len={max_model_len}: must be in [2, {limit}] "
                             "(the model's max_position_embeddings)")
        self.model = model
        self.device = next(model.parameters()).device
        self.speculator = speculator
        self.k = 0 if speculator is None else speculator.k
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.record_logit_gaps = record_logit_gaps

    @torch.no_grad()
    def run(self, requests: list[Request], on_finish=None) -> None:
        """Generate for every request in place (output_token_ids, finish_reason, spec counts,
        timestamps). on_finish(request) is called as each one ends."""
        if not requests:
            return
        longest = max(len(r.prompt_token_ids) + r.params.max_tokens for r in requests)
        max_len = min(self.max_model_len, longest) + self.k + 2
        cache = ModelCache(self.model, min(self.max_num_seqs, len(requests)), max_len,
                           0 if self.speculator is None else self.speculator.num_draft_modules)
        if self.speculator is not None:
            self.speculator.allocate(cache)
        self.cache = cache
        waiting, running = deque(requests), []
        while waiting or running:
            admitted = []
            while waiting and cache.num_free_rows():
                r = waiting.popleft()
                r.row = cache.allocate_row()
                r.arrival_time = time.perf_counter()
                admitted.append(r)
            if admitted:
                self._prefill(admitted)
                running += admitted
            running = self._retire(running, on_finish)
            if running:
                self._decode(running)
                running = self._retire(running, on_finish)

    def _retire(self, running, on_finish):
        keep = []
        for r in running:
            if r.finish_reason is None:
                keep.append(r)
            else:
                self.cache.free_row(r.row)
                if on_finish is not None:
                    on_finish(r)
        return keep

    # ---- steps --------------------------------------------------------------------------------
    def _prefill(self, reqs: list[Request]) -> None:
        cache, model = self.cache, self.model
        dev = self.device
        rows = torch.tensor([r.row for r in reqs], device=dev)
        lens = torch.tensor([len(r.prompt_token_ids) for r in reqs], device=dev)
        meta = ForwardMeta.build(torch.zeros_like(lens), lens, rows)
        ids = torch.zeros(meta.valid.shape, dtype=torch.long, device=dev)
        for b, r in enumerate(reqs):
            ids[b, : len(r.prompt_token_ids)] = torch.tensor(r.prompt_token_ids, device=dev)
        cache.tokens[rows[:, None].expand_as(ids)[meta.valid], meta.positions[meta.valid]] = ids[meta.valid]
        if self.speculator is not None:
            self.speculator.reset_rows(rows)
        h = model.model(ids, meta, cache.target)                           # [B, T, hidden]
        logits = model.lm_head(last_valid(h, meta))                        # [B, vocab]
        tok = logits.argmax(-1)
        cache.tokens[rows, lens] = tok
        gaps = self._gaps(logits[:, None])
        for b, r in enumerate(reqs):
            self._emit(r, [int(tok[b])], gaps[b] if gaps is not None else None, 0, 0)
        self._propose(reqs, rows, lens + 1, meta, h)

    def _decode(self, reqs: list[Request]) -> None:
        cache, model = self.cache, self.model
        dev = self.device
        rows = torch.tensor([r.row for r in reqs], device=dev)
        n = torch.tensor([r.num_tokens - 1 for r in reqs], device=dev)
        num_drafts = torch.tensor([self._draft_budget(r) for r in reqs], device=dev)
        meta = ForwardMeta.build(n, 1 + num_drafts, rows, keep_states=True)
        ids = cache.tokens[rows[:, None], meta.positions]                  # [B, T]: x_n, d_1..d_k
        ids = torch.where(meta.valid, ids, 0)
        h = model.model(ids, meta, cache.target)
        logits = model.lm_head(h)                                          # [B, T, vocab]
        target = logits.argmax(-1)                                         # [B, T]
        match = (ids[:, 1:] == target[:, :-1]) & meta.valid[:, 1:]
        accepted = match.long().cumprod(1).sum(1)                         # [B] = m
        cache.commit_recurrent(accepted)
        gaps = self._gaps(logits)
        # known tokens x_{n+1..n+m+1} = target[:, :m+1] (accepted drafts, then the bonus token)
        keep = torch.arange(target.shape[1], device=dev)[None] <= accepted[:, None]     # [B, T]
        cache.tokens[rows[:, None].expand_as(target)[keep], (meta.positions + 1)[keep]] = target[keep]
        emitted_tokens, accepted_list = target.tolist(), accepted.tolist()
        for b, r in enumerate(reqs):
            m = accepted_list[b]
            self._emit(r, emitted_tokens[b][: m + 1], gaps[b] if gaps is not None else None,
                       int(num_drafts[b]), m)
        new = ForwardMeta.build(n, accepted + 1, rows)                     # accepted positions n..n+m
        self._propose(reqs, rows, n + accepted + 2, new, h[:, : new.valid.shape[1]])

    # ---- helpers ------------------------------------------------------------------------------
    def _draft_budget(self, r: Request) -> int:
        """Never propose more drafts than the request can still use (ARCHITECTURE.md inv. 7)."""
        if self.speculator is None:
            return 0
        room = min(r.params.max_tokens - len(r.output_token_ids),
                   self.max_model_len - r.num_tokens)
        return max(0, min(len(r.draft_token_ids), room - 1))

    def _propose(self, reqs, rows, num_tokens, meta: ForwardMeta, hidden: torch.Tensor) -> None:
        """Draft for the requests of this step that are still running; meta/hidden: the target's
        newly verified positions of all `reqs` ([B, T, hidden])."""
        keep = [b for b, r in enumerate(reqs) if r.finish_reason is None]
        if self.speculator is None or not keep:
            return
        if len(keep) < len(reqs):
            idx = torch.tensor(keep, device=self.device)
            rows, num_tokens, hidden = rows[idx], num_tokens[idx], hidden[idx]
            meta = meta.select(idx)
        drafts = self.speculator.propose(self.cache, rows, num_tokens, meta, hidden).tolist()
        for b, d in zip(keep, drafts):
            reqs[b].draft_token_ids = d

    def _gaps(self, logits: torch.Tensor):
        if not self.record_logit_gaps:
            return None
        top2 = logits.float().topk(2, dim=-1).values
        return (top2[..., 0] - top2[..., 1]).tolist()                      # [B][T]

    def _emit(self, r: Request, tokens: list[int], gaps, num_draft_tokens: int, num_accepted: int):
        """Append verified tokens; stop at a stop token, max_tokens or max_model_len. Tokens after
        the stop are dropped and do not count as accepted."""
        now = time.perf_counter()
        if r.first_token_time is None:
            r.first_token_time = now
        emitted = 0
        for i, t in enumerate(tokens):
            r.output_token_ids.append(t)
            if gaps is not None:
                r.logit_gaps.append(gaps[i])
            emitted = i + 1
            if t in r.stop_ids:
                r.finish_reason = "stop"
            elif len(r.output_token_ids) >= r.params.max_tokens or r.num_tokens >= self.max_model_len:
                r.finish_reason = "length"
            if r.finish_reason is not None:
                r.finish_time = now
                break
        r.spec.record_round(num_draft_tokens, min(num_accepted, emitted))
