"""The masked draft round inside the compiled step: the grammar's host work as one opaque operator
per draft, so that a batch with constrained requests drafts through a compiled graph too
(docs/structured_output.md, "Drafting under the mask").

`mtpx::grammar_draft(logits [B, V] float, index) -> tokens [B] int64` is a torch custom operator
(torch.library.custom_op; https://pytorch.org/docs/stable/library.html). Inductor calls it as an
extern kernel and never looks inside. It runs the round's GrammarDraftSampler (drafts.py) on the
host: masks the constrained rows' logits by their grammar state, takes the argmax, and advances
their matchers through the chosen drafts. Draft i+1's logits depend on draft i's token, so the
calls run in draft order. The sampler is set for the length of the round with `active(sampler)`.
The graph is the same for every grammar and batch (its inputs carry no grammar), so one graph per
column and module count serves every constrained batch: `plan_and_draft_masked`, the compiled
step's draft loop (mtpx/engine/compiled.py's plan_and_draft) with this operator in place of the
argmax. Probabilistic drafts (a DraftSampler inside) still run eager.
"""
from __future__ import annotations

import contextlib

import torch

from mtpx.spec_decode.protocol import DraftBatch

_ACTIVE: list = [None]          # the GrammarDraftSampler of the round running now


@torch.library.custom_op("mtpx::grammar_draft", mutates_args=())
def grammar_draft(logits: torch.Tensor, index: int) -> torch.Tensor:
    """The active GrammarDraftSampler's draft tokens [B] (int64) from draft logits [B, V] at
    draft index `index` (module doc). Raises RuntimeError outside `active`."""
    sampler = _ACTIVE[0]
    if sampler is None:
        raise RuntimeError("mtpx::grammar_draft called outside structured.draft_op.active()")
    return sampler(logits, index).clone()


@grammar_draft.register_fake
def _(logits: torch.Tensor, index: int) -> torch.Tensor:
    return logits.new_empty(logits.shape[:1], dtype=torch.long)


def graph_sampler(logits: torch.Tensor, i: int) -> torch.Tensor:
    """DraftBatch.sampler inside a compiled round: the operator (no q: argmax drafts)."""
    return torch.ops.mtpx.grammar_draft(logits, i)


@contextlib.contextmanager
def active(sampler):
    """The round's GrammarDraftSampler for the operator's calls."""
    _ACTIVE[0] = sampler
    try:
        yield
    finally:
        _ACTIVE[0] = None


def in_graph(sampler) -> bool:
    """Whether a round with `sampler` (DraftBatch.sampler) can run compiled with the operator: a
    GrammarDraftSampler of argmax drafts."""
    from mtpx.structured.drafts import GrammarDraftSampler
    return isinstance(sampler, GrammarDraftSampler) and sampler.inner is None


def plan_and_draft_masked(speculator, cache, block_table, rows, num_tokens, target_end, is_drafting, depth,
                          target_start, drafts, target_hidden, num_columns, num_drafts, num_modules):
    """mtpx.engine.compiled.plan_and_draft (its arguments and results) with the drafts from
    `graph_sampler`: -> (Drafts.tokens, Drafts.num_final)."""
    batch = DraftBatch(rows, num_tokens, target_end, is_drafting, depth, target_start, target_hidden,
                       num_drafts, num_modules, num_columns, block_table, drafts=drafts,
                       sampler=graph_sampler)
    out = speculator.propose(cache, batch)
    return out.tokens, out.num_final
