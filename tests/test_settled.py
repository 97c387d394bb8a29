"""Settled decisions (mtpx/auto_k/settled.py): a full decision that keeps the k in use holds for
settled_interval - 1 more steps of the same batch, a probe's step excepted, as does a running
depth's vote to stay; a change is seen at the next full decision."""
from __future__ import annotations

import pytest

from mtpx.auto_k import AutoDraftLength, AutoKConfig
from tests.test_auto_k import costs, lower, step

KW = dict(min_verified=0, explore_costs=False, patience=1)


def pair(max_k: int, ms: dict, **kw) -> tuple[AutoDraftLength, AutoDraftLength]:
    """The default policy (settled_interval 4) and one deciding every step, alike otherwise."""
    return (AutoDraftLength(max_k, ms, AutoKConfig(**KW, **kw)),
            AutoDraftLength(max_k, ms, AutoKConfig(**KW, settled_interval=1, **kw)))


def test_a_settled_k_holds_three_steps_and_a_fall_is_seen_at_the_next_full_decision():
    p, q = pair(1, costs({0: [10.0, 10.0], 1: [12.0, 12.0]}), probe_interval=0)
    assert p.settled_interval == 4
    for r in (p, q):
        r.acceptance = [0.7]                               # k = 1: 1.7 / 12 beats 1 / 10
    assert [step(p, 1) for _ in range(2)] == [step(q, 1) for _ in range(2)] == [1, 1]   # settled at step 1
    for r in (p, q):
        r.acceptance = [0.05]                              # now 1 / 10 beats 1.05 / 12 by far
    assert [step(q, 1) for _ in range(3)] == [0, 0, 0]     # step 3 falls (patience 1)
    assert [step(p, 1) for _ in range(3)] == [1, 1, 0]     # steps 3 and 4 hold step 1's; step 5 decides
    assert (p.k, p._steps, p._switch_streak) == (q.k, q._steps, q._switch_streak) == (0, 5, 0)


@pytest.mark.parametrize("batch,top", [(4, 1), (1, 0)])
def test_another_batch_or_deepest_depth_is_decided_at_once(batch, top):
    """Held only for the same batch size, depths and deepest depth: batch 4 (where k = 0 pays), or
    batch 1 whose request runs at depth 0 (no k above it), decides anew in the step it appears."""
    p, q = pair(1, costs({0: [10.0, 10.0], 1: [12.0, 60.0]}), probe_interval=0)
    for r in (p, q):
        r.acceptance = [0.7]
        assert step(r, 1) == 1
    assert [step(r, batch, top) for r in (p, q)] == [0, 0]
    assert p.k == q.k == 0 and p._steps == q._steps == 2


def test_probe_steps_and_a_steady_run_are_the_full_decisions():
    """In a steady state the held decisions are the full ones, every probe included."""
    p, q = pair(2, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [17.0, 17.0]}), probe_interval=6)
    for r in (p, q):
        r.acceptance = [0.7, 0.5]                          # k = 1: 1.7 / 12; k = 2: 2.05 / 17
    ks = [step(q, 1) for _ in range(40)]
    assert [step(p, 1) for _ in range(40)] == ks
    assert ks.count(2) == 3 and ks.count(0) == 3 and set(ks) == {0, 1, 2}   # probes at steps 6, 12, ...
    assert (p.k, p._probes) == (q.k, q._probes)


def test_a_running_depths_vote_to_stay_holds_and_its_fall_is_seen_at_the_next_full_vote():
    p, q = pair(2, costs({0: [10.0, 10.0], 1: [12.0, 12.0], 2: [14.0, 14.0]}), probe_interval=0)
    for r in (p, q):
        r.acceptance = [0.9, 0.9]
    votes = {id(p): [], id(q): []}
    for i in range(6):
        if i == 2:
            for r in (p, q):
                r.acceptance = [0.05, 0.05]                # now depth 0 pays
        for r in (p, q):
            votes[id(r)].append(lower(r, 1, 2))
            r.k = 2                                        # hold the k in use: the depth's own vote
            r.commit(r.decide(1, 2))
            r.k = 2
    assert votes[id(q)] == [2, 2, 0, 0, 0, 0]
    assert votes[id(p)] == [2, 2, 2, 2, 0, 0]              # votes 2 and 3 held vote 0's


def test_a_running_depth_at_another_batch_size_is_voted_at_once():
    p, q = pair(1, costs({0: [10.0, 10.0], 1: [12.0, 60.0]}), probe_interval=0)
    for r in (p, q):
        r.acceptance = [0.7]
        assert lower(r, 1, 1) == 1                         # batch 1: depth 1 pays, a settled vote
        r.commit(r.decide(1, 1))
        assert lower(r, 4, 1) == 0                         # batch 4: falls at once (patience 1)
