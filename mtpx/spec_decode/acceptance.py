"""Acceptance rules beside the lossless verifiers (`spec.acceptance`): opt-in rules that accept more
drafts at a cost in quality, and a synthetic rule for benchmarking. mtpx/evaluate/quality.py measures
what a rule costs; docs/acceptance_rules.md is the user's page.

Each rule gives the probability a_i [B, K] of accepting draft i (given every earlier draft was
accepted), and verification then runs as token-level speculative sampling
(mtpx/spec_decode/verification.py): accept while eta_i < a_i, and after a rejection sample from
norm(max(p_i - q_i, 0)). Shapes as there: x [B, K] drafts, q [B, K, V] their draft distributions,
p [B, K + 1, V] the target's (one-hot at temperature 0), eta [B, K] uniforms; `logits` [B, K + 1, V]
the target's processed logits; `greedy` [B] bool, the temperature-0 rows.

- lossless: a = min(1, p(x) / q(x)) (Leviathan et al. 2023).
- typical (Cai et al. 2024, "Medusa", §2.3.1; vLLM's TypicalAcceptanceSampler): a = 1 when
  p(x) > min(eps, delta * exp(-H(p))), else the lossless a. Neutral (lossless): eps >= 1 and
  delta >= V, where the threshold is >= 1. At temperature 0 p is one-hot: lossless at any setting.
- relaxed (TensorRT-LLM's MTP relaxed acceptance, `relaxed_topk`, `relaxed_delta`): x is a
  candidate when it is among the top N of s and s(x) >= max s - delta, with s the target's
  softmax of its logits at temperature 1 for greedy rows (as TensorRT-LLM reads the logits) and p
  for sampled rows; a candidate is accepted as if it had the top token's probability,
  a = min(1, max p / q(x)) (1 at temperature 0), others get the lossless a. Neutral: N = 1,
  delta = 0 (only the top token is a candidate, and its a is the lossless one).
- lenient (Leviathan et al. 2023, appendix A.5, "lenience" l = 1 / lambda): a = min(1, lambda *
  p(x) / q(x)), lambda >= 1. Neutral: lambda = 1. (Written min(1, p / (lambda q)) with lambda <= 1
  in the paper; a lambda >= 1 in the denominator would accept fewer drafts, not more.) At
  temperature 0 p is one-hot: lossless at any lambda.
- cascade (Narasimhan et al. 2024, "Faster Cascades via Speculative Decoding", arXiv 2405.19261,
  the speculative cascade with the "Diff" deferral rule): draft i is verified against
  pi = (1 - r) q + r p with r = 1[max q < max p - alpha] (defer to the target unless the drafter
  is at least as confident as the target less alpha). r = 0 accepts the draft (pi = q); r = 1 is
  the lossless test. alpha in [-1, 1]; neutral: alpha = -1 (always defers). It reads the draft's
  distribution, so it needs probabilistic drafts; greedy rows always defer.
- synthetic (vLLM's rejection_sample_method="synthetic", `synthetic_acceptance_rates`): accepts
  draft i with the conditional probability r_i / r_{i-1} (r_{-1} = 1), from its own generator,
  whatever the draft, so the per-position acceptance (docs/metrics.md) is r_i; after a rejection
  (or all accepted) the token comes from the target's p at that position. For benchmarking the
  engine at a given acceptance only: its outputs are not the model's. Neutral: every rate 0 (plain
  decoding's tokens at temperature 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from mtpx.spec_decode.verification import _pick, _ratio, residual, token_acceptance_probs

RULES = ("lossless", "typical", "relaxed", "lenient", "cascade", "synthetic")


@dataclass
class AcceptanceConfig:
    """The acceptance rule and its settings (the spec group's and speculative_config's keys; the
    engine's EngineConfig has them too). check_acceptance() raises ValueError, one line naming
    spec.KEY, for a setting no rule can run with."""

    acceptance: Literal["lossless", "typical", "relaxed", "lenient", "cascade", "synthetic"] = "lossless"
    """How drafts are accepted: lossless (the output is the target's: greedy, token-level or block
    verification), or a lossy rule measured against it (docs/acceptance_rules.md): typical, relaxed,
    lenient, cascade, or synthetic (fixed per-position rates, benchmarking only)."""
    posterior_threshold: float = 0.09
    """typical: eps, the largest threshold on p(draft) (vLLM's typical acceptance name; Medusa's
    default 0.09); >= 0."""
    posterior_alpha: float = 0.3
    """typical: delta, the threshold's scale delta * exp(-entropy) (vLLM's name; Medusa's 0.3); >= 0."""
    relaxed_topk: int = 1
    """relaxed: N, a candidate draft is among the target's top N (TensorRT-LLM's name); >= 1."""
    relaxed_delta: float = 0.0
    """relaxed: a candidate's probability is at least the top token's less delta (TensorRT-LLM's
    name); in [0, 1]."""
    lenient_lambda: float = 1.0
    """lenient: accept with probability min(1, lambda * p / q); >= 1 (1: lossless)."""
    cascade_alpha: float = 0.0
    """cascade: defer to the target when max q < max p - alpha; in [-1, 1] (-1: lossless)."""
    synthetic_acceptance_rates: Optional[list[float]] = None
    """synthetic: per-position unconditional acceptance rates, one per draft position (vLLM's name),
    each in [0, 1], non-increasing."""

    def check_acceptance(self) -> None:
        """ValueError naming spec.KEY for a bad setting (docs/acceptance_rules.md)."""
        def num(key, ok, requirement):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(float(v)):
                raise ValueError(f"spec.{key}={v!r}: must be {requirement}")

        num("posterior_threshold", lambda v: v >= 0, "a number >= 0 (typical's eps)")
        num("posterior_alpha", lambda v: v >= 0, "a number >= 0 (typical's delta)")
        k = self.relaxed_topk
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"spec.relaxed_topk={k!r}: must be an integer >= 1 (1: the target's top token)")
        num("relaxed_delta", lambda v: 0 <= v <= 1, "a number in [0, 1]")
        num("lenient_lambda", lambda v: 1 <= v < math.inf, "a finite number >= 1 (1: lossless)")
        num("cascade_alpha", lambda v: -1 <= v <= 1, "a number in [-1, 1] (-1: lossless)")
        rates = self.synthetic_acceptance_rates
        if rates is not None:
            rates = list(rates) if isinstance(rates, (list, tuple)) else rates
            if (not isinstance(rates, list) or not rates or any(_bad_rate(r) for r in rates)
                    or any(b > a for a, b in zip(rates, rates[1:]))):
                raise ValueError(f"spec.synthetic_acceptance_rates={self.synthetic_acceptance_rates!r}: give "
                                 "a non-increasing list of rates in [0, 1], one per draft position, e.g. "
                                 "[0.8,0.6,0.4]")
        if self.acceptance == "synthetic" and rates is None:
            raise ValueError("spec.acceptance=synthetic needs spec.synthetic_acceptance_rates: a list of "
                             "per-position rates in [0, 1], e.g. [0.8,0.6,0.4]")
        if self.acceptance not in ("lossless", None) and getattr(self, "verify", "standard") == "block":
            raise ValueError(f"spec.acceptance={self.acceptance} runs on token-level verification: set "
                             "spec.verify=standard (block verification is lossless only)")
        if self.acceptance == "cascade" and getattr(self, "draft_sample_method", None) != "probabilistic":
            raise ValueError("spec.acceptance=cascade reads the draft's distribution: set "
                             "spec.draft_sample_method=probabilistic")


def _bad_rate(r) -> bool:
    return isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1


def _accept(a, x, q, p, num_drafts, eta, after_reject="residual"):
    """Token-level verification with acceptance probabilities a [B, K] (verify_token_level with
    its a replaced). after_reject: "residual" (norm(max(p - q, 0))) or "target" (p)."""
    B, K = x.shape
    ok = (eta < a) & (torch.arange(K, device=x.device) < num_drafts[:, None])
    m = ok.long().cumprod(1).sum(1)
    b = torch.arange(B, device=x.device)
    if after_reject == "target":
        return m, p[b, m]
    rejected = m < num_drafts
    q_m = q[b, m.clamp(max=K - 1)]
    return m, torch.where(rejected[:, None], residual(p[b, m], q_m), p[b, m])


def typical_probs(x, q, p, eps: float, delta: float) -> torch.Tensor:
    """Typical acceptance (module doc): [B, K]."""
    pk = p[:, : x.shape[1]]
    entropy = -torch.special.xlogy(pk, pk).sum(-1)                         # [B, K], nats
    threshold = torch.clamp(delta * torch.exp(-entropy), max=eps)
    return torch.where(_pick(pk, x) > threshold, 1.0, token_acceptance_probs(x, q, p))


def relaxed_probs(x, q, p, s, topk: int, delta: float) -> torch.Tensor:
    """Relaxed acceptance (module doc); s [B, K + 1, V] the distribution candidates are judged on."""
    K = x.shape[1]
    sk = s[:, :K]
    top = sk.topk(min(topk, sk.shape[-1]), dim=-1).indices                # [B, K, N]
    candidate = (top == x[..., None]).any(-1) & (_pick(sk, x) >= sk.max(-1).values - delta)
    qx = _pick(q, x)
    pmax = p[:, :K].max(-1).values
    as_top = torch.where(qx > 0, pmax / qx.clamp(min=torch.finfo(qx.dtype).tiny), 1.0).clamp(max=1)
    return torch.where(candidate, as_top, token_acceptance_probs(x, q, p))


def lenient_probs(x, q, p, lam: float) -> torch.Tensor:
    """Lenient acceptance (module doc): min(1, lambda p / q), [B, K]."""
    return (lam * _ratio(x, q, p)).clamp(max=1)


def cascade_probs(x, q, p, greedy, alpha: float) -> torch.Tensor:
    """Speculative cascade, Diff deferral rule (module doc): [B, K]."""
    K = x.shape[1]
    defer = (q.max(-1).values < p[:, :K].max(-1).values - alpha) | greedy[:, None]
    return torch.where(defer, token_acceptance_probs(x, q, p), 1.0)


def conditional_rates(rates: list[float]) -> list[float]:
    """Per-position unconditional rates r_i -> conditional r_i / r_{i-1} (0 after a 0)."""
    prev, out = 1.0, []
    for r in rates:
        out.append(r / prev if prev > 0 else 0.0)
        prev = r
    return out


class AcceptanceRule:
    """A lossy rule as a verifier: rule(x, q, p, num_drafts, eta, logits=, greedy=) -> (num_accepted
    [B], final [B, V]) (verification.verify's `rule`). config: AcceptanceConfig (checked);
    num_speculative_tokens: the most drafts a step verifies (synthetic needs a rate for each)."""

    def __init__(self, config: AcceptanceConfig, num_speculative_tokens: int):
        self.name = config.acceptance
        self.config = config
        rates = config.synthetic_acceptance_rates
        if self.name == "synthetic":
            if len(rates) != num_speculative_tokens:
                raise ValueError(f"spec.synthetic_acceptance_rates has {len(rates)} rates for "
                                 f"num_speculative_tokens={num_speculative_tokens}: give one per position")
            self.conditional = torch.tensor(conditional_rates([float(r) for r in rates]), dtype=torch.float64)
            self.generator = torch.Generator().manual_seed(0)

    def verify_greedy(self, ids, logits, num_drafts):
        """An all-greedy batch (temperature 0) without probabilities or uniforms, as the lossless
        argmax path: ids [B, T], logits [B, T, V], num_drafts [B] -> (accepted [B], emitted [B, T])
        as verification.verify; None for synthetic (random by design). At temperature 0 every
        acceptance probability is 0 or 1 and the token after the accepted drafts is the target's
        argmax, so this gives the tokens of the general path: typical, lenient and cascade are
        greedy matching there (module doc), relaxed also accepts its candidates on the softmax
        of the logits."""
        if self.name == "synthetic":
            return None
        B, T = ids.shape
        target = logits.argmax(-1)                                         # [B, T]
        x = ids[:, 1:]
        ok = x == target[:, :-1]
        if self.name == "relaxed":
            s = logits.double().softmax(-1)[:, : T - 1]           # the general path's s, greedy rows
            top = s.topk(min(int(self.config.relaxed_topk), s.shape[-1]), dim=-1).indices
            delta = float(self.config.relaxed_delta)
            ok |= (top == x[..., None]).any(-1) & (_pick(s, x) >= s.max(-1).values - delta)
        ok &= torch.arange(T - 1, device=ids.device)[None] < num_drafts[:, None]
        accepted = ok.long().cumprod(1).sum(1)
        drafts = torch.cat([x, target[:, -1:]], 1)
        kept = torch.arange(T, device=ids.device)[None] < accepted[:, None]
        return accepted, torch.where(kept, drafts, target)

    def tree_candidates(self, tokens, parents, logits):
        """Greedy tree verification (temperature 0) under this rule: tokens, parents [B, T] int64
        (the root's parent -1), logits [B, T, V] the target's processed logits after each node ->
        [B, T] bool, the nodes accepted besides those equal to their parent's argmax (relaxed's
        candidates, judged on the parent's softmax as in `verify_greedy`), or None where the rule
        is greedy matching at temperature 0 (typical, lenient, cascade)."""
        if self.name != "relaxed":
            return None
        s = logits.double().softmax(-1)                                   # [B, T, V]
        top = s.topk(min(int(self.config.relaxed_topk), s.shape[-1]), dim=-1).indices
        par = parents.clamp(min=0)
        in_top = (top.gather(1, par[..., None].expand(-1, -1, top.shape[-1])) == tokens[..., None]).any(-1)
        s_par = s.gather(1, par[..., None].expand(-1, -1, s.shape[-1]))  # [B, T, V]: the parent's
        close = _pick(s_par, tokens) >= s_par.max(-1).values - float(self.config.relaxed_delta)
        return in_top & close

    def __call__(self, x, q, p, num_drafts, eta, *, logits, greedy):
        c = self.config
        if self.name == "synthetic":
            u = torch.rand(x.shape, generator=self.generator, dtype=torch.float64).to(x.device)
            a = self.conditional[: x.shape[1]].to(x.device).expand(x.shape)
            return _accept(a, x, q, p, num_drafts, u, after_reject="target")
        if self.name == "typical":
            a = typical_probs(x, q, p, float(c.posterior_threshold), float(c.posterior_alpha))
        elif self.name == "relaxed":
            s = torch.where(greedy[:, None, None], logits.to(p.dtype).softmax(-1), p)
            a = relaxed_probs(x, q, p, s, int(c.relaxed_topk), float(c.relaxed_delta))
        elif self.name == "lenient":
            a = lenient_probs(x, q, p, float(c.lenient_lambda))
        elif self.name == "cascade":
            a = cascade_probs(x, q, p, greedy, float(c.cascade_alpha))
        else:
            raise ValueError(f"spec.acceptance={self.name!r}: choose one of {', '.join(RULES)}")
        return _accept(a, x, q, p, num_drafts, eta)


def build_rule(config, num_speculative_tokens: int) -> AcceptanceRule | None:
    """The engine's rule from its config (an AcceptanceConfig or an EngineConfig): None for lossless
    or without drafts (num_speculative_tokens 0: no speculator)."""
    if getattr(config, "acceptance", "lossless") == "lossless" or not num_speculative_tokens:
        return None
    return AcceptanceRule(config, num_speculative_tokens)
