"""What the model runner does with the target's logits besides verifying: each request's logits
processing before sampling and verification (SamplingParams, "Logits processing"), and the
logprobs it returns."""
from __future__ import annotations

import torch


def process_logits(reqs, logits: torch.Tensor, ids: torch.Tensor | None = None, grammars=None):
    """`_process` (below), then, with the runner's `grammars` (mtpx/structured/masks.py's
    GrammarMasks), each structured-output request's grammar mask on every column: column j with
    the grammar state after the request's drafts d_1 .. d_j (docs/structured_output.md)."""
    out = _process(reqs, logits, ids)
    if grammars is None or all(r.grammar is None for r in reqs):
        return out
    drafts = [r.draft_token_ids[: logits.shape[1] - 1] for r in reqs] if logits.dim() == 3 else None
    return grammars.apply(reqs, out, logits, drafts)


def _process(reqs, logits: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """The target's logits as each request samples from them (SamplingParams, "Logits
    processing"; vLLM's order): logit_bias added, then each request's stop ids (EOS,
    stop_token_ids) at -inf before params.min_tokens output tokens, every token outside
    allowed_token_ids and the bad words' last tokens (_ban_words) at -inf, then the repetition,
    frequency and presence penalties. logits: [B, V] (the next token of each request) or
    [B, T, V], verification windows ids [B, T] = [x_n, d_1 .. d_{T-1}]: column j is output
    token len(output) + j, processed as if d_1 .. d_j were committed (they are, if column j is
    reached), so speculation commits what plain decoding would. Returns a copy (float32 for
    16-bit logits), or
    `logits` itself when no request asks for anything. Verification against the processed
    target stays exact: a draft the target gives probability 0 is rejected."""
    window = logits.dim() == 3
    T = logits.shape[1] if window else 1
    masks = [(b, j, sorted(r.stop_ids)) for b, r in enumerate(reqs) if r.stop_ids
             for j in range(max(0, min(r.params.min_tokens - len(r.output_token_ids), T)))]
    biased = [b for b, r in enumerate(reqs) if r.params.logit_bias]
    penalized = [b for b, r in enumerate(reqs) if r.params.has_penalties]
    allowed = [b for b, r in enumerate(reqs) if r.params.allowed_token_ids]
    banned = [b for b, r in enumerate(reqs) if r.bad_words_token_ids]
    if not (masks or biased or penalized or allowed or banned):
        return logits
    out = (logits if logits.dtype in (torch.float32, torch.float64) else logits.float()).clone()
    view = out if window else out[:, None]                                    # [B, T, V]
    V, dev, dtype = view.shape[-1], view.device, view.dtype
    for b in biased:
        bias = reqs[b].params.logit_bias
        view[b, :, torch.tensor(list(bias), device=dev)] += torch.tensor(list(bias.values()), dtype=dtype,
                                                                         device=dev)
    for b, j, stop in masks:
        view[b, j, [i for i in stop if i < V]] = float("-inf")
    for b in allowed:
        keep = torch.zeros(V, dtype=torch.bool, device=dev)
        keep[[t for t in reqs[b].params.allowed_token_ids if t < V]] = True
        view[b, :, ~keep] = float("-inf")
    for b in banned:
        _ban_words(view[b], reqs[b], ids[b, 1:].tolist() if window else [])
    for b in penalized:
        r = reqs[b]
        counts = torch.bincount(torch.tensor(r.output_token_ids, dtype=torch.long, device=dev),
                                minlength=V).to(dtype)[None].expand(T, V)        # [T, V]
        if window and T > 1:           # column j also counts drafts d_1 .. d_j
            seen = torch.nn.functional.one_hot(ids[b, 1:], V).to(dtype).cumsum(0)
            counts = counts + torch.cat([torch.zeros(1, V, dtype=dtype, device=dev), seen])
        view[b] = apply_penalties(view[b], r, counts)
    return out


def apply_penalties(x: torch.Tensor, r, counts: torch.Tensor) -> torch.Tensor:
    """Request r's repetition, frequency and presence penalties on its columns x [T, V], counts
    [T, V] (each column's output token counts, drafts before it included) -> [T, V] (vLLM's rules:
    repetition divides positive / multiplies negative logits of tokens in the prompt or counted)."""
    p, V = r.params, x.shape[-1]
    if p.repetition_penalty != 1:
        prompt = torch.zeros(V, dtype=torch.bool, device=x.device)
        prompt[torch.tensor(r.prompt_token_ids, dtype=torch.long, device=x.device)] = True
        seen = prompt[None] | (counts > 0)
        scaled = torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
        x = torch.where(seen, scaled, x)
    return x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).to(x.dtype)


def _ban_words(x: torch.Tensor, r, drafts: list[int]) -> None:
    """vLLM's bad-words processor on one request's columns x [T, V]: the last token of a bad word
    is at -inf where the tokens before it end the output so far (column j: output + d_1 .. d_j)."""
    for j in range(x.shape[0]):
        seen = r.output_token_ids + drafts[:j]
        for seq in r.bad_words_token_ids:
            if len(seen) >= len(seq) - 1 and seen[len(seen) - len(seq) + 1:] == seq[:-1]:
                x[j, seq[-1]] = float("-inf")


def logprobs(wants: list[int | None], logits: torch.Tensor, tokens: torch.Tensor):
    """For row b with wants[b] not None (how many top tokens): per position of logits
    [B, T, V] (raw, vLLM's "raw_logprobs"), (logprob of tokens [B, T], its rank (1 = most
    likely), the top wants[b] (id, logprob) pairs); None for the other rows, or None when no
    row wants any. One host transfer, only in steps where some row asks."""
    if all(w is None for w in wants):
        return None
    lp = torch.log_softmax(logits.float(), dim=-1)
    tok = lp.gather(-1, tokens[..., None])                                    # [B, T, 1]
    rank = (lp > tok).sum(-1) + 1
    top = lp.topk(max(w or 0 for w in wants), dim=-1) if any(wants) else None
    tok_l, rank_l = tok[..., 0].tolist(), rank.tolist()
    top_v, top_i = (top.values.tolist(), top.indices.tolist()) if top is not None else (None, None)
    out = []
    for b, w in enumerate(wants):
        if w is None:
            out.append(None)
            continue
        out.append([(tok_l[b][t], rank_l[b][t],
                     list(zip(top_i[b][t][:w], top_v[b][t][:w])) if w else [])
                    for t in range(len(tok_l[b]))])
    return out
