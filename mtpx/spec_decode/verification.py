"""Verification of draft tokens at temperature > 0: token-level speculative sampling and block
verification. Both keep the output distribution exactly equal to sampling from the target.

Shapes (B requests, K draft positions, V vocabulary), all probabilities float64 or float32:
    x: [B, K] int64 draft tokens; q: [B, K, V] the draft distributions they were sampled from
    (one-hot for greedy drafts, as vLLM does); p: [B, K + 1, V] the target distributions at the
    same positions plus the bonus position; num_drafts: [B] int64 (K_b <= K real drafts per row);
    eta: [B, K] uniforms in [0, 1) (one per draft position, from each request's own generator).
A verifier returns (num_accepted [B], final [B, V]): accept x[b, :num_accepted[b]], then sample one
token from final[b] (the residual distribution after a rejection, or p at the bonus position).

Token level (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling"): accept x_i with
probability min(1, p_i(x_i) / q_i(x_i)) while every earlier draft was accepted; at the first
rejection sample from norm(max(p_i - q_i, 0)); if all pass, sample the bonus token from p_{K_b}.

Block verification (Sun et al. 2025, "Block Verification Accelerates Speculative Decoding",
arXiv 2403.10444, Algorithm 2): with weights w_0 = 1, w_i = min(1, w_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i))
(position i-1 holds the distributions of draft i), residual mass
r_i = sum_v max(w_i p_i(v) - q_i(v), 0) and thresholds
    h_i = r_i / (r_i + 1 - w_i)   for i < K_b,        h_{K_b} = w_{K_b},
the number accepted is tau = the LAST i with eta_i < h_i (0 if none), and the final token comes
from norm(max(w_tau p_tau - q_tau, 0)) when tau < K_b, else from p_{K_b}. It never accepts fewer
tokens in expectation than token level (the paper's Theorem 2; tests/test_verification.py checks it
exactly on small cases).
"""
from __future__ import annotations

from functools import partial

import torch

from mtpx.spec_decode.sampler import RequestSampling, sample
from mtpx.spec_decode.tree_sampling import tree_targets


def _pick(dist: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """dist [B, K, V], tokens [B, K] -> dist at the tokens, [B, K]."""
    return dist.gather(-1, tokens[..., None])[..., 0]


def residual(p: torch.Tensor, q: torch.Tensor, weight: torch.Tensor | float = 1.0) -> torch.Tensor:
    """norm(max(weight * p - q, 0)) over the last dim; where that is all zero (p == q: a rejection
    had probability 0) it falls back to p. p, q: [..., V]; weight: [...] or a float."""
    w = weight if isinstance(weight, float) else weight[..., None]
    r = (w * p - q).clamp(min=0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp(min=torch.finfo(r.dtype).tiny), p)


def _ratio(x: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """p_i(x_i) / q_i(x_i) for every draft position, [B, K] (1 where q_i(x_i) = 0: such a draft
    cannot have been sampled)."""
    K = x.shape[1]
    qx, px = _pick(q, x), _pick(p[:, :K], x)
    return torch.where(qx > 0, px / qx.clamp(min=torch.finfo(qx.dtype).tiny), 1.0)


def token_acceptance_probs(x: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """min(1, p_i(x_i) / q_i(x_i)) for every draft position: [B, K]."""
    return _ratio(x, q, p).clamp(max=1)


def block_thresholds(x: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                     num_drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's thresholds h [B, K] (0 beyond num_drafts) and weights w [B, K + 1]
    (w_0 = 1), the recursion in the module doc."""
    B, K = x.shape
    ratio = _ratio(x, q, p)
    w = [torch.ones(B, dtype=p.dtype, device=p.device)]
    h = []
    for i in range(1, K + 1):
        wi = (w[-1] * ratio[:, i - 1]).clamp(max=1)
        w.append(wi)
        if i < K:
            r = (wi[:, None] * p[:, i] - q[:, i]).clamp(min=0).sum(-1)
        else:                                               # only as the last draft: h = w
            r = torch.zeros_like(wi)
        denom = r + 1 - wi
        hi = torch.where(denom > 0, r / denom.clamp(min=torch.finfo(r.dtype).tiny), 1.0)
        hi = torch.where(num_drafts == i, wi, hi)           # the last real draft: h = w
        h.append(torch.where(num_drafts >= i, hi, 0.0))
    return torch.stack(h, 1), torch.stack(w, 1)


def verify_token_level(x, q, p, num_drafts, eta):
    """Token-level speculative sampling (module doc). Returns (num_accepted [B], final [B, V])."""
    B, K = x.shape
    ok = (eta < token_acceptance_probs(x, q, p)) & (torch.arange(K, device=x.device) < num_drafts[:, None])
    m = ok.long().cumprod(1).sum(1)
    b = torch.arange(B, device=x.device)
    rejected = m < num_drafts
    q_m = q[b, m.clamp(max=K - 1)]
    final = torch.where(rejected[:, None], residual(p[b, m], q_m), p[b, m])
    return m, final


def verify_block(x, q, p, num_drafts, eta):
    """Block verification (Sun et al., arXiv 2403.10444; module doc). Returns (num_accepted [B],
    final [B, V])."""
    B, K = x.shape
    h, w = block_thresholds(x, q, p, num_drafts)
    hit = eta < h                                            # [B, K]; P(eta < h) = h
    idx = torch.arange(1, K + 1, device=x.device)
    tau = torch.where(hit, idx, 0).max(1).values             # the last i with eta_i < h_i
    b = torch.arange(B, device=x.device)
    q_t = q[b, tau.clamp(max=K - 1)]
    final = torch.where((tau < num_drafts)[:, None], residual(p[b, tau], q_t, w[b, tau]), p[b, tau])
    return tau, final


VERIFIERS = {"standard": verify_token_level, "block": verify_block}


def verify_by_position(ids: torch.Tensor, logits: torch.Tensor, num_drafts: torch.Tensor,
                       sampling: RequestSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy-drafted (one-hot) chains verified with one uniform per output position, as trees are
    (mtpx/spec_decode/tree_sampling.py): the token at output position j is plain seeded sampling's
    y_j ~ p_j, draft d_j is accepted while y_j == d_j. For one-hot drafts that is token-level
    rejection's distribution (d_j accepted with probability p_j(d_j), else a sample of p_j without
    d_j), and a seeded request's output does not depend on whether a step ran a chain or a tree.
    ids [B, T], logits [B, T, V], num_drafts [B] int64 -> verify's (accepted, emitted)."""
    B, T = ids.shape
    depths = torch.arange(T, device=ids.device).expand(B, T)
    targets, uniforms = tree_targets(sampling, logits, depths, T - 1)
    is_draft = torch.arange(T - 1, device=ids.device)[None] < num_drafts[:, None]
    accepted = ((ids[:, 1:] == targets[:, :-1]) & is_draft).long().cumprod(1).sum(1)
    if uniforms is not None:
        uniforms.settle((accepted + 1).tolist())
    return accepted, targets


def verify(ids: torch.Tensor, logits: torch.Tensor, num_drafts: list[int],
           sampling: RequestSampling, draft_probs: list, method: str = "standard", rule=None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify B windows [x_n, d_1 .. d_{T-1}], greedy and sampled requests alike.

    ids: [B, T] int64 window tokens (drafts beyond num_drafts[b] are padding); logits: [B, T, V]
    the target's logits there; num_drafts: drafts per row (host ints); sampling: the rows'
    RequestSampling; draft_probs: per row None (greedy drafts: one-hot q, as vLLM) or [k, V], the
    distributions sampled drafts came from; method: "standard" or "block" (VERIFIERS), or "position"
    (verify_by_position, for greedy drafts; "standard" for sampled ones); rule: None
    (lossless) or a lossy acceptance rule (mtpx/spec_decode/acceptance.py), which replaces method.

    Returns (accepted [B] int64, emitted [B, T] int64): emitted[b, :accepted[b]] are the accepted
    drafts and emitted[b, accepted[b]] the token after them (the target's next token, or the
    residual sample after a rejection); later entries are unspecified. An all-greedy batch is
    verified by argmax matching with no host sync; a greedy row of a sampled batch has a one-hot
    target distribution, which reduces to the same.
    """
    B, T = ids.shape
    nd = torch.tensor(num_drafts, device=ids.device)
    if sampling.all_greedy and rule is not None and (fast := rule.verify_greedy(ids, logits, nd)) is not None:
        return fast                                                        # no host sync either
    if sampling.all_greedy and rule is None:
        target = logits.argmax(-1)                                         # [B, T]
        is_draft = torch.arange(T - 1, device=ids.device)[None] < nd[:, None]
        match = (ids[:, 1:] == target[:, :-1]) & is_draft
        return match.long().cumprod(1).sum(1), target
    if method == "position" and rule is None and all(q is None for q in draft_probs):
        return verify_by_position(ids, logits, nd, sampling)
    p = sampling.probs(logits)                                             # [B, T, V]
    x = ids[:, 1:]                                                         # drafts [B, T-1]
    if T > 1:
        q = torch.nn.functional.one_hot(x, p.shape[-1]).to(p.dtype)        # greedy drafts
        for b, probs in enumerate(draft_probs):
            if probs is not None and num_drafts[b]:
                q[b, : num_drafts[b]] = probs[: num_drafts[b]].to(p.dtype)
        verifier = VERIFIERS[method] if rule is None else partial(rule, logits=logits, greedy=sampling.greedy)
        accepted, final = verifier(x, q, p, nd, sampling.uniforms(num_drafts, T - 1))
    else:
        accepted, final = torch.zeros(B, dtype=torch.long, device=ids.device), p[:, 0]
    y = sample(final, sampling.uniforms([1] * B)[:, 0])
    emitted = torch.cat([x, torch.zeros(B, 1, dtype=x.dtype, device=x.device)], 1)
    emitted[torch.arange(B, device=ids.device), accepted] = y
    return accepted, emitted
