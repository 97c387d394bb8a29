"""The decode step's one interface: StepShapes decides the shapes, a DecodeStep (eager or
compiled) runs verify / commit / draft, and a speculator is reached through five methods."""
from __future__ import annotations

import inspect

import pytest
import torch

from mtpx import SamplingParams
from mtpx.engine.decode_step import EagerStep, StepShapes
from mtpx.spec_decode import MultiModuleMTPSpeculator, SingleModuleMTPSpeculator
from mtpx.spec_decode.protocol import DraftBatch, Speculator
from tests.helpers import make_llm

PROMPTS = [[5, 9, 13, 2, 7], [3, 4, 5, 6, 7, 8, 9, 10, 11], [20, 21, 22]]


def _plan(static: bool, num_tokens, num_draft_tokens, depths, prev, num_drafts, k=8, modules=8, batch=None,
          buckets=(0, 1, 2, 4, 8)):
    """StepShapes.plan of a step whose k is num_drafts: each request proposes min(num_drafts, depth)."""
    new = [min(num_drafts, d) for d in depths]
    return StepShapes.plan(num_tokens, num_draft_tokens, depths, prev, new, k=k,
                           num_draft_modules=modules, block_size=16, max_blocks=64,
                           padded_batch=batch or len(num_tokens), static=static, depth_buckets=buckets)


def test_step_shapes_eager_are_exact_and_static_are_bucketed():
    # mtp8 at a fixed k = 8: every request verifies 8 drafts and proposes 8
    eager = _plan(False, [40, 70], [8, 8], [8, 8], [8, 8], 8)
    assert (eager.window, eager.depth, eager.num_drafts, eager.draft_columns) == (9, 8, 8, 9)
    assert eager.num_blocks == -(-(69 + 2 * 8 + 2) // 16) == 6 and eager.keep_states
    static = _plan(True, [40, 70], [8, 8], [8, 8], [8, 8], 8, batch=2)
    assert (static.window, static.draft_columns, static.num_blocks) == (9, 9, 8)     # 6 blocks -> bucket 8
    # automatic k: depths 1 and 3, k = 3 this step, the deeper request caught up from 1 draft
    eager = _plan(False, [30, 30], [1, 1], [1, 3], [1, 1], 3)
    assert (eager.window, eager.depth, eager.num_drafts, eager.draft_columns) == (2, 3, 3, 4)
    static = _plan(True, [30, 30], [1, 1], [1, 3], [1, 1], 3, batch=2)
    assert (static.window, static.depth, static.num_drafts, static.draft_columns) == (5, 4, 3, 5)   # bucket 4
    static = _plan(True, [30, 30], [1, 1], [1, 3], [1, 1], 3, batch=2, buckets=[])        # buckets 0 and k
    assert (static.window, static.depth, static.num_drafts, static.draft_columns) == (9, 8, 3, 9)
    # module 4 only caught up behind 2 drafts (modules 1-2 drafted, 3 ran over the last draft), so
    # drafting 4 it covers 3 - 1 + 4 positions: eager 6 columns; static, a round without drafts
    # first, then both rounds in 4 + 1 columns
    eager = _plan(False, [30, 30], [2, 2], [3, 4], [2, 2], 4)
    assert (eager.window, eager.draft_columns, eager.catch_up) == (3, 6, False)
    static = _plan(True, [30, 30], [2, 2], [3, 4], [2, 2], 4, batch=2)
    assert (static.window, static.draft_columns, static.catch_up) == (5, 5, True)
    # one draft more than the round before (the step after a probe one below the k in use): the
    # module after the drafting ones reached the last known token over the last draft, so it
    # re-prefills max(window, 4) positions, and no catch-up round runs
    eager = _plan(False, [30, 30], [3, 3], [3, 4], [3, 3], 4)
    assert (eager.window, eager.draft_columns, eager.catch_up) == (4, 4, False)
    static = _plan(True, [30, 30], [3, 3], [3, 4], [3, 3], 4, batch=2)
    assert (static.window, static.draft_columns, static.catch_up) == (5, 5, False)
    # a step that neither verifies nor proposes (k = 0): 1-token windows, no state kept
    narrow = _plan(True, [30], [0], [0], [0], 0)
    assert (narrow.window, narrow.depth, narrow.keep_states) == (1, 0, False)
    # ... whose requests keep their depth: the modules' catch-up in the round of k + 1 columns
    narrow = _plan(True, [30], [0], [8], [0], 0, buckets=None)
    assert (narrow.window, narrow.depth, narrow.draft_columns, narrow.catch_up) == (1, 8, 9, False)
    assert _plan(False, [30], [0], [8], [0], 0).draft_columns == 1
    # single-module MTP: one module, the window bounds every forward
    single = _plan(False, [30], [3], [3], [1], 3, k=3, modules=1)
    assert single.draft_columns == 4
    plain = _plan(True, [30, 31, 32], [0, 0, 0], [0, 0, 0], [0, 0, 0], 0, k=0, modules=0, batch=4)
    assert (plain.window, plain.padded_batch, plain.draft_columns) == (1, 4, 1)


def test_the_speculator_interface_has_five_methods():
    def public(cls):
        return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
    assert public(Speculator) == {"allocate", "reset_rows", "plan", "propose", "hold"}
    for cls in (SingleModuleMTPSpeculator, MultiModuleMTPSpeculator):
        assert public(cls) == {"allocate", "reset_rows", "plan", "propose", "hold"}, cls
        assert list(inspect.signature(cls.propose).parameters) == ["self", "cache", "batch", "plan"]


@pytest.mark.parametrize("spec,k", [("mtp1", 3), ("mtp8", 4)])
def test_planning_changes_no_state_and_propose_records_progress(trained_tiny, spec, k):
    llm = make_llm(trained_tiny, spec, k, max_num_seqs=2, check_invariants=False)  # rows of finished requests
    llm.generate(PROMPTS[:2], SamplingParams(max_tokens=6, ignore_eos=True))
    runner, speculator = llm.engine.runner, llm.engine.speculator
    cache = runner.cache
    with torch.inference_mode():
        rows = torch.tensor([0, 1])
        speculator.reset_rows(rows, torch.tensor([2, 3]))
        before = [b.clone() for b in speculator.buffers]
        hidden = torch.randn(2, 4, trained_tiny.cfg.hidden_size, dtype=torch.float64)
        batch = DraftBatch(rows, torch.tensor([7, 8]), torch.tensor([6, 7]), torch.tensor([True, True]),
                           torch.tensor([k, k]), torch.tensor([2, 3]), hidden, k)
        plan = speculator.plan(cache, batch)
        assert all(torch.equal(a, b) for a, b in zip(before, speculator.buffers))
        assert plan.metas and [c.tolist() for c in plan.computed][0] == [6, 7]
        drafts = speculator.propose(cache, batch, plan)
        computed = speculator.computed[rows]
        assert (computed if computed.dim() == 1 else computed[:, 0]).tolist() == [6, 7]
        assert drafts.tokens.shape == (2, k) and drafts.probs is None
        assert torch.equal(cache.tokens[rows, 7:7 + k][0], drafts.tokens[0])


class SpyStep:
    """A DecodeStep that counts the runner's calls and forwards them to the eager step."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.static = inner.static

    def padded_batch(self, batch):
        return self.inner.padded_batch(batch)

    def packed_tokens(self, num_tokens, grid_tokens):
        return self.inner.packed_tokens(num_tokens, grid_tokens)

    def verify(self, meta):
        self.calls.append("verify")
        return self.inner.verify(meta)

    def commit(self, index, save=None):
        self.calls.append("commit")
        self.inner.commit(index, save)

    def draft(self, batch):
        self.calls.append("draft")
        return self.inner.draft(batch)


def test_the_runner_decodes_through_any_decode_step(trained_tiny):
    """The runner's decode calls only the DecodeStep interface: a spy in its place sees verify,
    commit and draft once per decode step, and the tokens are the eager step's."""
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    expected = [o.output_token_ids for o in make_llm(trained_tiny, "mtp8", 4).generate(PROMPTS, params)]
    llm = make_llm(trained_tiny, "mtp8", 4)
    assert isinstance(llm.engine.runner.step, EagerStep) and llm.engine.compiled is None
    spy = llm.engine.runner.step = SpyStep(llm.engine.runner.step)
    assert [o.output_token_ids for o in llm.generate(PROMPTS, params)] == expected
    n = spy.calls.count("verify")
    assert n > 0 and spy.calls == ["verify", "commit", "draft"] * n
