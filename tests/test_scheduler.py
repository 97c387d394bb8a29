"""The scheduler on hand-made cases (no model): chunking, admission, preemption, draft budget, and
update_from_output as the one writer of request progress."""
from __future__ import annotations

from mtpx.core.kv_cache_manager import KVCacheManager
from mtpx.auto_k import AutoDraftLength, AutoKConfig, FixedDraftLength
from mtpx.engine.model_runner import RequestResult, RunnerOutput
from mtpx.core.request import Request
from mtpx.core.sampling_params import SamplingParams
from mtpx.core.scheduler import ScheduledDecode, ScheduledPrefill, Scheduler


def make(num_blocks=32, block_size=4, budget=2048, k=0, max_num_seqs=8, prefix=False, max_model_len=100):
    kv = KVCacheManager(num_blocks, block_size, prefix, k)
    return Scheduler(kv, max_num_seqs, budget, FixedDraftLength(k), max_len=max_model_len + 2 * k + 2,
                     max_model_len=max_model_len)


def req(i, n, max_tokens=8, stop=()):
    return Request(i, list(range(10 + i, 10 + i + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   frozenset(stop))


def result(out, tokens=None, drafts=None, accepted=None, final=None):
    """A RunnerOutput: per request the given tokens (default: one token 7 for complete prompts)."""
    res = {}
    for item in out.prefills + out.decodes:
        r = item.request
        last = isinstance(item, ScheduledDecode) or item.is_last
        res[r.index] = RequestResult(
            (tokens or {}).get(r.index, [7] if last else []),
            item.num_draft_tokens if isinstance(item, ScheduledDecode) else 0,
            (accepted or {}).get(r.index, 0), draft_token_ids=(drafts or {}).get(r.index, []),
            num_final_tokens=(final or {}).get(r.index, 0))
    return RunnerOutput(res)


def test_chunks_end_on_block_boundaries():
    s = make(block_size=4, budget=6)
    r = req(0, 10)
    s.add(r)
    out = s.schedule()
    assert [(p.start, p.num_tokens, p.is_last, p.new) for p in out.prefills] == [(0, 4, False, True)]
    assert s.update_from_output(out, result(out)) == []
    assert r.num_computed_tokens == 4 and r.output_token_ids == []
    out = s.schedule()                                   # the last chunk may end anywhere
    assert [(p.start, p.num_tokens, p.is_last, p.new) for p in out.prefills] == [(4, 6, True, False)]
    s.update_from_output(out, result(out))
    assert r.num_computed_tokens == 10 and r.output_token_ids == [7] and not r.is_prefilling


def test_admission_stops_at_the_budget():
    s = make(block_size=4, budget=8)
    for i in range(3):
        s.add(req(i, 5))
    out = s.schedule()
    # request 0 takes 5 tokens; 3 are left, less than a block: request 1 waits
    assert [(p.request.index, p.num_tokens) for p in out.prefills] == [(0, 5)]
    assert [r.index for r in s.waiting] == [1, 2]
    s2 = make(block_size=2, budget=8)
    for i in range(3):
        s2.add(req(i, 5))
    out = s2.schedule()                                  # 3 left: a 2-token chunk of request 1
    assert [(p.request.index, p.num_tokens, p.is_last) for p in out.prefills] == [(0, 5, True), (1, 2, False)]


def test_max_num_seqs_bounds_admission():
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add(req(i, 3))
    assert [p.request.index for p in s.schedule().prefills] == [0, 1]


def test_preemption_takes_the_most_recently_admitted():
    # 6 blocks of 2: A (4 tokens) and B (4 tokens) take 2 blocks each (+ the slot of the next token)
    s = make(num_blocks=6, block_size=2, max_model_len=40)
    a, b = req(0, 4, max_tokens=20), req(1, 4, max_tokens=20)
    s.add(a)
    s.add(b)
    out = s.schedule()
    s.update_from_output(out, result(out))
    steps, preempted = 0, []
    while not preempted and steps < 10:
        out = s.schedule()
        preempted = out.preempted
        s.update_from_output(out, result(out))
        steps += 1
    assert preempted == [b] and b.num_preemptions == 1 and s.num_preemptions == 1
    assert b.num_computed_tokens == 0 and s.waiting[0] is b and b.draft_token_ids == []
    assert not s.kv.has_request(b.index) and a in s.running


def test_draft_budget_caps_the_window():
    s = make(k=4, max_model_len=100)
    r = req(0, 5, max_tokens=3)
    s.add(r)
    out = s.schedule()
    s.update_from_output(out, result(out, drafts={0: [1, 2, 3, 4]}))
    assert r.output_token_ids == [7] and r.draft_token_ids == [1, 2, 3, 4]
    out = s.schedule()      # 2 more tokens allowed: 1 draft + the bonus token
    assert [d.num_draft_tokens for d in out.decodes] == [1]
    s2 = make(k=4, max_model_len=8)
    r2 = req(0, 5, max_tokens=50)
    s2.add(r2)
    out = s2.schedule()
    s2.update_from_output(out, result(out, drafts={0: [1, 2, 3, 4]}))
    out = s2.schedule()     # 6 known, max_model_len 8: 2 positions left -> 1 draft
    assert [d.num_draft_tokens for d in out.decodes] == [1]


def test_the_steps_k_is_what_it_proposes_and_the_policy_learns_from_each_round():
    s = make(k=4)
    policy = s.draft_length = AutoDraftLength(4, config=AutoKConfig(prior_weight=1.0, prior_acceptance=1.0))
    r = req(0, 5, max_tokens=50)
    s.add(r)
    out = s.schedule()
    assert out.num_speculative_tokens == 4          # no step costs yet: every step drafts max_k
    s.update_from_output(out, result(out, drafts={0: [1, 2, 3, 4]}))
    policy.forced = 2
    out = s.schedule()                              # 4 drafts in hand: verify all 4, propose 2
    assert out.num_speculative_tokens == 2 and [d.num_draft_tokens for d in out.decodes] == [4]
    res = result(out, drafts={0: [5, 6]})
    res.results[0].num_accepted = 1                 # draft 1 accepted, draft 2 rejected
    s.update_from_output(out, res)
    assert policy.acceptance == [1.0, 0.5, 0.5, 0.5] and policy.num_observed == [1, 1, 0, 0]
    assert dict(policy.histogram) == {2: 1}
    policy.forced = 0
    out = s.schedule()                              # the 2 proposed are verified, none proposed
    assert out.num_speculative_tokens == 0 and [d.num_draft_tokens for d in out.decodes] == [2]
    s.update_from_output(out, result(out))
    out = s.schedule()
    assert [d.num_draft_tokens for d in out.decodes] == [0]


def test_update_cuts_at_a_stop_and_counts_committed_tokens():
    s = make(k=4)
    r = req(0, 5, max_tokens=20, stop=(42,))
    s.add(r)
    out = s.schedule()
    s.update_from_output(out, result(out, drafts={0: [40, 41, 42, 43]}))
    out = s.schedule()
    assert [d.num_draft_tokens for d in out.decodes] == [4]
    # the verifier accepted all 4 drafts; the stop token 42 ends the request after 3 of them
    finished = s.update_from_output(out, result(out, tokens={0: [40, 41, 42, 43, 44]}, accepted={0: 4}))
    assert finished == [r] and r.finish_reason == "stop"
    assert r.output_token_ids == [7, 40, 41, 42]
    assert (r.spec.rounds == [(4, 4, 3)] and r.spec.num_accepted_tokens == 4
            and r.spec.num_committed_tokens == 3)
    assert r not in s.running and not s.kv.has_request(r.index)


def test_update_publishes_what_is_final():
    s = make(block_size=4, prefix=True)
    r = req(0, 9, max_tokens=20)
    s.add(r)
    out = s.schedule()
    s.update_from_output(out, result(out, final={0: 5}))   # only positions < 5 are final
    assert s.kv.pool.num_cached_blocks == 1
    out = s.schedule()
    s.update_from_output(out, result(out, final={0: 9}))
    assert s.kv.pool.num_cached_blocks == 2


def test_abort_frees_and_reports_once():
    s = make()
    r = req(0, 3)
    s.add(r)
    out = s.schedule()
    s.update_from_output(out, result(out))
    assert s.abort(r) is True and r.finish_reason == "abort" and not s.has_work()
    assert s.abort(r) is False
    assert s.abort(req(1, 3)) is False                   # never added


def test_scheduled_items_carry_block_tables():
    s = make(block_size=4)
    s.add(req(0, 6))
    out = s.schedule()
    [p] = out.prefills
    assert (isinstance(p, ScheduledPrefill) and p.block_table == s.kv.block_table(0)
            and len(p.block_table) == 2)


def test_duplicate_request_ids_are_refused_while_in_flight():
    import pytest
    s = make()
    a = req(0, 3, max_tokens=1)
    s.add(a)
    with pytest.raises(ValueError, match="request id 0 is already in the engine"):
        s.add(req(0, 4))
    out = s.schedule()
    assert s.update_from_output(out, result(out)) == [a]
    s.add(req(0, 4))                                     # the id is free again once a finished


def test_a_step_that_admits_requests_decides_its_k_for_the_batch_they_join():
    """The drafts a step proposes are verified by the next step, of every running request: a
    first step admitting 8 requests decides k at batch 8, not at the 0 running before it (at
    batch 1, where k = 2 pays, it took k = 2 for all 8; at batch 8 k = 0 pays)."""
    s = make(k=2)
    s.draft_length = AutoDraftLength(2, {(0, 1): 10.0, (1, 1): 11.0, (2, 1): 12.0, (0, 8): 10.0, (1, 8): 40.0,
                                         (2, 8): 80.0},
                                     config=AutoKConfig(probe_interval=0, explore_costs=False,
                                                        explore_budget=0.0))
    asked = []
    decide = s.draft_length.decide
    s.draft_length.decide = lambda batch_size, *a, **kw: (asked.append(batch_size)
                                                          or decide(batch_size, *a, **kw))
    for i in range(8):
        s.add(req(i, 5))
    out = s.schedule()
    assert len(out.prefills) == 8 and asked == [8] and out.num_speculative_tokens == 0
