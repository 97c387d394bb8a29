"""Sampling (temperature > 0) on a tree of drafts, lossless, seeded per output position.

A tree's drafts are deterministic given the context: the children of a node are the draft's top-k.
The lossless multi-draft rule for deterministic (one-hot) drafts is recursive rejection (SpecInfer,
Miao et al. 2024, arXiv 2305.09781; SpecTr, Sun et al. 2023, arXiv 2310.15141): at a node whose
children hold tokens c_1 .. c_k, accept c_1 with probability p(c_1); if rejected, remove c_1 from p,
renormalise and try c_2; ...; when every child is rejected, sample the residual (p without the
children, renormalised). Child c_i then wins with probability exactly p(c_i), and the residual is p
conditioned on "no child": the token emitted at that position is distributed as p, as plain
sampling's would be. mtpx draws that token directly: y ~ p with the request's own generator,
descend into the child equal to y, else emit y and stop (`node_targets`, then
mtpx.spec_decode.tree.greedy_walk with y in place of the argmax). It is the same distribution as
recursive rejection, and it needs one uniform per emitted token.

Seeds: the token at output position j is the inverse-CDF sample of the target's processed
distribution there (mtpx.spec_decode.sampler.sample) at the request's j-th uniform, exactly as
plain seeded sampling draws it; `PositionUniforms` draws one uniform per depth and afterwards
rewinds each generator so that it advances by the tokens emitted only. A seeded request's output is
therefore independent of its batch-mates and of the tree's shape, and equal to plain seeded
sampling's (up to the rounding of the target's logits between the tree forward and a plain one).
Chain verification at temperature > 0 (mtpx.spec_decode.verification) draws one uniform per
verified draft and one for the final token instead, so a chain's seeded output differs from plain's.
"""
from __future__ import annotations

import torch

from mtpx.spec_decode.sampler import RequestSampling, sample


class PositionUniforms:
    """One uniform per output position for each row of `sampling`: u [B, width] float64, the next
    `width` uniforms of each sampled row's generator (0.5 for greedy rows). `settle(emitted)` then
    rewinds each generator and advances it by emitted[b] uniforms, as if it had drawn only those."""

    def __init__(self, sampling: RequestSampling, width: int):
        self.generators = sampling.generators
        self.states = [None if g is None else g.get_state() for g in self.generators]
        self.u = sampling.uniforms([width] * len(self.generators), width)

    def settle(self, emitted: list[int]) -> None:
        for g, state, m in zip(self.generators, self.states, emitted):
            if g is not None:
                g.set_state(state)
                torch.rand(m, generator=g, dtype=torch.float64)


def node_targets(probs: torch.Tensor, depths: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token the target emits after each node: probs [B, T, V] the target's processed
    distributions after the nodes, depths [B, T] int64 (the root 0), u [B, D + 1] one uniform per
    output position -> [B, T] int64, node t's the inverse-CDF sample of probs[b, t] at
    u[b, depths[b, t]] (nodes of one depth share the position's uniform: only one of them is on
    the path walked)."""
    B, T, V = probs.shape
    return sample(probs.reshape(B * T, V), u.gather(1, depths).reshape(B * T)).view(B, T)


def tree_targets(sampling: RequestSampling, logits: torch.Tensor, depths: torch.Tensor, depth: int
                 ) -> tuple[torch.Tensor, PositionUniforms | None]:
    """logits [B, T, V] (processed: logit_bias applied), depths [B, T], depth: the deepest node
    -> (targets [B, T] int64: the argmax for an all-greedy batch, else `node_targets` with greedy
    rows one-hot; the PositionUniforms to settle once the accepted lengths are known, or None)."""
    if sampling.all_greedy:
        return logits.argmax(-1), None
    uniforms = PositionUniforms(sampling, depth + 1)
    return node_targets(sampling.probs(logits), depths, uniforms.u), uniforms
