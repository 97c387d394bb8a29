"""Per-depth MTP losses (`train.mtp_loss`): cross-entropy on the data's next token, or a distance to
the target's own distribution, among them the acceptance losses.

Notation: for one draft position, q = softmax(draft_logits / T) is the draft's distribution and
p = softmax(target_logits / T) the target's for the same token, both at T = train.mtp_loss_temperature
(the target's as verification sees it: it conditions on the true tokens before). Every function
takes draft logits [N, V] (any float dtype; computed in float32) and returns the mean over the N
positions, in nats for ce / kl / lk_nll and as a probability for tv.

- ce: F.cross_entropy(draft_logits, labels), the data's next token (DeepSeek-V3 §2.2).
- kl: KL(p || q) = sum_v p_v (log p_v - log q_v), the forward KL of knowledge distillation at a
  temperature (Hinton et al. 2015, arXiv 1503.02531; EAGLE-3's and vLLM speculators' default
  `kl_div`), without Hinton's T^2 factor (the learning rate absorbs it).
- tv: total variation 1/2 sum_v |p_v - q_v| = 1 - alpha, with alpha = sum_v min(p_v, q_v) the
  probability that speculative sampling accepts a draft token drawn from q (Leviathan et al. 2023,
  arXiv 2211.17192, Theorem 3.5).
- lk_hybrid: lambda * KL + (1 - lambda) * TV with lambda = exp(-eta * sg[alpha]) per position
  (LK^lambda, Samarin et al. 2026, "LK Losses: Direct Acceptance Rate Optimization for Speculative
  Decoding", arXiv 2602.23881; eta = train.lk_loss_eta, 3 in the paper's best setting). KL carries
  the start, where alpha is small and TV's gradient vanishes; TV takes over as alpha grows.
- lk_nll: -log alpha per position (LK^alpha, the same paper: the negative log of the expected
  acceptance; its gradient is TV's times 1/alpha). It equals ce when p is one-hot.

Where mtpx had to choose (the paper's text was not at hand, only its summaries and two public
implementations that differ): alpha is taken per position and the losses averaged over positions,
as vLLM speculators' `lk_hybrid` and `nla` losses do, not from the batch's mean acceptance as
SpecForge's `compute_lk_loss` does (its "lambda" form also scales lambda by a `kl_scale`, here 1);
-log alpha is floored at alpha = 1e-8.

A target distribution given only as its top-k log-probabilities (hidden-state shards,
mtpx/train/shards.py) has -inf elsewhere: its p is 0 there, and p log p counts as 0. Passed as a
`TopK` (values, indices), the sums run over those K tokens only (p is 0 elsewhere, so KL and alpha
are the same), with log q_v = z_v / T - logsumexp(z / T): no [N, V] tensor but the logits.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

MTP_LOSSES = ("ce", "kl", "tv", "lk_hybrid", "lk_nll")
ALPHA_FLOOR = 1e-8


class TopK(NamedTuple):
    """The target's distribution on K tokens per position: log-probs `values` [N, K] (already at the
    temperature, renormalised over the K) and their token ids `indices` [N, K] int64; p = 0 elsewhere."""

    values: torch.Tensor
    indices: torch.Tensor


def _topk_log_q(draft_logits: torch.Tensor, target: TopK, temperature: float) -> torch.Tensor:
    """log q at the target's K tokens: [N, K] float32."""
    z = draft_logits.float() / temperature
    return z.gather(-1, target.indices) - torch.logsumexp(z, dim=-1, keepdim=True)


def acceptance(draft_logits: torch.Tensor, target_logp: torch.Tensor,
               temperature: float = 1.0) -> torch.Tensor:
    """alpha = sum_v min(p_v, q_v) per position: [N, V] logits, [N, V] target log-probs (already at
    the temperature; or a TopK) -> [N] float32 in [0, 1] (module doc)."""
    if isinstance(target_logp, TopK):
        return torch.minimum(target_logp.values.float().exp(),
                             _topk_log_q(draft_logits, target_logp, temperature).exp()).sum(-1)
    q = torch.softmax(draft_logits.float() / temperature, dim=-1)
    return torch.minimum(target_logp.float().exp(), q).sum(-1)


def kl_per_position(draft_logits: torch.Tensor, target_logp: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """KL(p || q) per position -> [N] float32 nats; p_v = 0 terms count 0 (module doc)."""
    if isinstance(target_logp, TopK):
        log_p = target_logp.values.float()
        return (log_p.exp() * (log_p - _topk_log_q(draft_logits, target_logp, temperature))).sum(-1)
    log_q = F.log_softmax(draft_logits.float() / temperature, dim=-1)
    log_p = target_logp.float()
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    return terms.sum(-1)


def ce_loss(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of labels [N] int64 under draft_logits [N, V] (nats, float32)."""
    return F.cross_entropy(draft_logits.float(), labels)


def kl_loss(draft_logits: torch.Tensor, target_logp: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Mean KL(p || q) (module doc)."""
    return kl_per_position(draft_logits, target_logp, temperature).mean()


def tv_loss(draft_logits: torch.Tensor, target_logp: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Mean total variation 1 - alpha (module doc)."""
    return (1.0 - acceptance(draft_logits, target_logp, temperature)).mean()


def lk_hybrid_loss(draft_logits: torch.Tensor, target_logp: torch.Tensor, temperature: float = 1.0,
                   eta: float = 3.0) -> torch.Tensor:
    """Mean of lambda * KL + (1 - lambda) * (1 - alpha), lambda = exp(-eta * alpha) without its
    gradient (LK^lambda, arXiv 2602.23881; module doc)."""
    alpha = acceptance(draft_logits, target_logp, temperature)
    lam = torch.exp(-eta * alpha.detach())
    kl = kl_per_position(draft_logits, target_logp, temperature)
    return (lam * kl + (1.0 - lam) * (1.0 - alpha)).mean()


def lk_nll_loss(draft_logits: torch.Tensor, target_logp: torch.Tensor,
                temperature: float = 1.0) -> torch.Tensor:
    """Mean -log alpha, alpha floored at 1e-8 (LK^alpha, arXiv 2602.23881; module doc)."""
    return -torch.log(acceptance(draft_logits, target_logp, temperature).clamp_min(ALPHA_FLOOR)).mean()


def target_log_probs(target_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(target_logits / T) in float32: [..., V] -> [..., V]."""
    return F.log_softmax(target_logits.float() / temperature, dim=-1)


def depth_loss(kind: str, draft_logits: torch.Tensor, labels: torch.Tensor,
               target_logp: torch.Tensor | None, temperature: float = 1.0, eta: float = 3.0) -> torch.Tensor:
    """The loss `kind` (one of MTP_LOSSES) of one depth: draft_logits [N, V]; labels [N] int64 (ce);
    target_logp [N, V] float32 at the temperature, or a TopK (every other kind; None for ce).

    Raises:
        ValueError: an unknown kind, or no target_logp for a distribution loss.
    """
    if kind == "ce":
        return ce_loss(draft_logits, labels)
    if kind not in MTP_LOSSES:
        raise ValueError(f"train.mtp_loss={kind!r}: use one of {', '.join(MTP_LOSSES)}")
    if target_logp is None:
        raise ValueError(f"train.mtp_loss={kind} needs the target's distribution")
    if kind == "kl":
        return kl_loss(draft_logits, target_logp, temperature)
    if kind == "tv":
        return tv_loss(draft_logits, target_logp, temperature)
    if kind == "lk_hybrid":
        return lk_hybrid_loss(draft_logits, target_logp, temperature, eta)
    return lk_nll_loss(draft_logits, target_logp, temperature)
