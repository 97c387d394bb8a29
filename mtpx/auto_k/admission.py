"""The depth of an admitted request, the admission half of automatic k (scheduler side, no
torch): functions of an AutoDraftLength `p` (mtpx/auto_k/policy.py, whose module doc gives the
rules, "Depth"), reading its estimates, costs and goodputs; they hold no state and change none."""
from __future__ import annotations

from mtpx.auto_k.choices import DepthChoice
from mtpx.auto_k.cost_learning import with_prefill

__all__ = ["admission_depth"]


def admission_depth(p, batch_size: int, mix, depths: list[int] | None, prompt_tokens: int,
                    max_tokens: int | None) -> DepthChoice:
    """p: the AutoDraftLength. The depth of a request admitted when batch_size requests run or
    wait: the k of highest predicted goodput at that batch size when that beats the k in use by more than the
    hysteresis (below it, for a request alone, its landing must also beat the k in use by the
    hysteresis with the unlearned positions at their upper estimates: admitted deeper, its depth
    can still fall once they are learned, shallower it never rises; rise_hysteresis
    above it, and only where `_rises`: depths, the
    running requests' depths, None: no check), else the k in use (as a step's k changes: a
    request admitted deeper than the steps draft would run its extra modules for nothing);
    each k's ms per token counts the request's module prefill at that depth, prompt_tokens
    of them spread over at most max_tokens output tokens (`prefill_ms`, `with_prefill`).
    Below the k in use it lands where `_landing` says; in a batch (batch_size > 1:
    the landed k's steps are every request's), above the best k on upper estimates that lead
    it by at most free_landing_lead only within exploring's budget, the prefill beyond the best
    k's then exploring's spend (alone, a request pays for its own test, as weighed in g).
    Exploring may admit it deeper (Exploring.target, weighing the same prefill); the
    prefill beyond the depth it would have had is then exploring's spend (explore_ms)."""
    top = p.max_k
    def prefill(depth: int) -> float:
        return p.costs.prefill_ms(depth, prompt_tokens)
    extra = [p.costs.prefill_ms(k, prompt_tokens) / max_tokens if max_tokens else 0.0
             for k in range(top + 1)]
    g = with_prefill(p._goodputs(batch_size, top, mix), extra)
    best = max(range(top + 1), key=g.__getitem__)
    depth, spend = p.k, 0.0
    if g[best] > (1 + (p.hysteresis if best < p.k else p.rise_hysteresis)) * g[p.k]:
        if best < p.k:
            depth = _landing(p, g, best, batch_size, mix)
            if batch_size == 1 and depth < p.k:   # alone: a depth never rises, and falls once learned
                upper = p._upper_goodputs(g, best, p.k, mix)
                depth = depth if upper[depth] > (1 + p.hysteresis) * upper[p.k] else p.k
            if batch_size > 1 and depth > best and \
                    p._upper_goodputs(g, best, depth, mix)[depth] \
                    <= (1 + p.free_landing_lead) * g[best]:
                if p.exploring.exhausted():      # a marginal lead: exploring's
                    depth = best
                else:
                    spend = prefill(depth) - prefill(best)
        elif _rises(p, g, best, batch_size, mix, depths, extra):
            depth = best
    target = p.exploring.target(p.estimates, depth, batch_size, top, mix, extra)
    if target is not None:
        spend += prefill(target) - prefill(depth)
        depth = target
    if not spend:
        return DepthChoice(depth, None)
    return DepthChoice(depth, None, explore_ms=spend,
                       step_ms=p.costs.step_cost_curve(batch_size)[p.k])

def _landing(p, g: list[float], best: int, batch_size: int, mix) -> int:
    """Where an admission lands below the k in use (g: its goodputs, its prefill in; best: their
    best). admission_landing "request" (default): AutoDraftLength._landing on g (a wave can split
    by prompt length: its short prompts land); "batch": that on the batch's goodputs without the
    request's prefill, taken where it lands above their own best (alike for every prompt),
    else best; "off": best. Measured: experiments/concurrency/draft_costs ("batch" won the
    first chunk of compiled concurrency 16, tied its whole cell, and lost eager
    concurrency 4: the first wave tested k = 6, and the k in use fell to 3, not 4)."""
    mode = p.admission_landing
    if mode == "off":
        return best
    if mode == "request":
        return p._landing(g, best, p.k, mix)
    gb = p._goodputs(batch_size, p.k, mix)
    best_b = max(range(p.k + 1), key=gb.__getitem__)
    land = p._landing(gb, best_b, p.k, mix)
    return land if land > best_b else best

def _rises(p, g: list[float], best: int, batch_size: int, mix, depths: list[int] | None,
                     extra: list[float] | None = None) -> bool:
    """Whether a request is admitted at `best`, above the k in use (g: `_goodputs` without
    depths, best beating the k in use by rise_hysteresis): with the running requests' depths
    and this one a step at best would too (held cost curve, each request at min(k, its depth)),
    or best does with its unlearned positions past the k in use at their lower estimates
    (`optimism` deviations below). Else the batch would not follow: the request pays its extra
    modules' catch-up every step and learns nothing (module doc). True without depths or with
    none running. extra: the new request's module prefill per token at each k (`with_prefill`)."""
    if not depths:
        return True
    k, margin, est = p.k, 1 + p.rise_hysteresis, p.estimates
    with_it = list(depths) + [best]
    gh = p._goodputs(batch_size, best, mix, depths=with_it,
                        curve=p.costs.held_cost_curve(batch_size, max(with_it)))
    if extra is not None:
        gh = with_prefill(gh, extra)
    if gh[best] > margin * gh[k]:
        return True
    low = (est.expected_tokens(best, mix, k, -p.optimism, p.min_verified)
           / est.expected_tokens(best, mix))
    return g[best] * low > margin * g[k]
