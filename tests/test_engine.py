"""The engine end to end (paged KV, continuous batching, prefix caching, chunked prefill,
preemption, abort) against plain greedy decoding.

Greedy decoding with MTP is lossless, so every engine configuration must emit exactly the tokens of
the reference (plain decoding, defaults). Every engine here runs with check_invariants=True: each KV
write asserts that no published prefix-cache block is written, and the block pool's bookkeeping is
checked after every step. After every generate nothing may leak (all blocks free, all batch slots
free, the scheduler empty).
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from mtpx import LLM, SamplingParams
from tests.helpers import (GAP_TOL, _params, assert_clean, assert_matches_reference, blocks_needed,  # noqa: F401
                           generate, install_draft_check, lookahead, make_llm, reference, run_checked)

def shared_prefix_prompts() -> list[list[int]]:
    """Prompts cut from two base sequences at block-aligned and unaligned lengths, with suffixes."""
    a = [(5 + 3 * i) % 60 + 2 for i in range(32)]
    b = [(17 * i + 11) % 64 for i in range(32)]
    return [a[:20] + [7, 9], a[:16] + [40], a[:23], b[:12] + [1, 2, 3], a[:9],
            b[:24], a[:16] + [41, 42], b[:13] + [63]]


# ---- 1. random workloads ------------------------------------------------------------------------
# (sampled_from favours its first entries: the richest configurations come first)
SPECS = st.sampled_from([("mtp8", 4), ("mtp1", 3), ("mtp8", 2), (None, None), ("mtp1", 1),
                         ("mtp8", 1), ("mtp1", 2), ("mtp8", 3)])


@st.composite
def workloads(draw):
    """Prompts (1-40 tokens) cut from a few random base sequences plus random suffixes, so that
    they share prefixes; per-request max_tokens (1-24); an optional stop token for all."""
    bases = draw(st.lists(st.lists(st.integers(0, 63), min_size=40, max_size=40),
                          min_size=1, max_size=3))
    n = draw(st.one_of(st.integers(2, 6), st.integers(1, 32)))      # mostly small
    prompts = []
    for _ in range(n):
        base = bases[draw(st.integers(0, len(bases) - 1))]
        cut = draw(st.one_of(st.integers(0, 40), st.sampled_from([4, 8, 12, 16, 24, 32])))
        suffix = draw(st.lists(st.integers(0, 63), min_size=0 if cut else 1,
                               max_size=min(8, 40 - cut)))
        prompts.append(base[:cut] + suffix)
    max_tokens = draw(st.lists(st.integers(1, 24), min_size=n, max_size=n))
    stop = draw(st.one_of(st.none(), st.none(), st.integers(0, 63)))
    return prompts, max_tokens, stop


def _min_hit_blocks(prompt_len: int, out_len: int, la: int, B: int) -> int:
    """Blocks a second pass over the same prompt must hit when nothing was evicted: the first pass
    published at least the prompt blocks below min(num_computed, num_tokens - lookahead) after its
    prefill (a speculator whose request ended at the prefill never computed them), and a hit
    covers the blocks followed by la more prompt tokens (their keys), leaving one to compute."""
    published = prompt_len // B if la == 0 else (prompt_len + 1 - la) // B if out_len >= 2 else 0
    return min(min(prompt_len - 1, prompt_len - la) // B, published)


def _preemption_forced(prompts, max_tokens, stop, k, B, num_blocks, max_num_seqs) -> bool:
    """A sufficient condition for preemption. The first step admits the longest prefix A of the
    requests whose reservations (prompt + k slots: the scheduler reserves room for the drafts) fit
    the pool. Tables never shrink and later admissions only add blocks, so whenever a request f of
    A ends (its table then covers >= prompt + max_tokens - 1 positions; without a stop token every
    request emits max_tokens), the members of A still running hold at least their admission
    blocks. If no finishing order of A fits that way, someone was preempted (a finish that fits
    never makes another one not fit, so removing any request that fits decides it)."""
    if stop is not None:
        return False
    adm, end = [], []
    for p, t in list(zip(prompts, max_tokens))[:max_num_seqs]:
        a = -(-(len(p) + k) // B)
        if sum(adm) + a > num_blocks:
            break
        adm.append(a)
        end.append(-(-(len(p) + t - 1) // B))
    while len(adm) >= 2:
        fits = [i for i in range(len(adm)) if end[i] + sum(adm) - adm[i] <= num_blocks]
        if not fits:
            return True
        del adm[fits[0]], end[fits[0]]
    return False


@settings(max_examples=int(os.environ.get("MTPX_ENGINE_EXAMPLES", 12)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(w=workloads(), spec=SPECS, B=st.sampled_from([4, 8, 16]), preempt_prefix=st.booleans())
def test_random_workloads_equal_plain_greedy(trained_tiny, w, spec, B, preempt_prefix):
    model = trained_tiny
    prompts, max_tokens, stop = w
    params = [_params(t, stop) for t in max_tokens]
    name, k = spec
    la = lookahead(name, k)
    kk = 0 if name is None else k
    ref = reference(model, prompts, params)
    need = [blocks_needed(len(p), t, kk, B) for p, t in zip(prompts, max_tokens)]
    kw = dict(spec=name, k=k, block_size=B)

    def check(llm):
        _, outs, reqs = generate(llm, prompts, params)
        assert_matches_reference(model, outs, prompts, params)
        return reqs

    # prefix caching off, 16 batch slots
    check(make_llm(model, max_num_seqs=16, **kw))

    # prefix caching on, twice over the same prompts; the pool is large enough that the FIFO free
    # queue never evicts a published block, so the second pass must hit
    llm = make_llm(model, max_num_seqs=16, enable_prefix_caching=True,
                   num_blocks=2 * sum(need) + 1, **kw)
    check(llm)
    reqs = check(llm)
    for i, p in enumerate(prompts):
        want = _min_hit_blocks(len(p), len(ref[i]), la, B) * B
        assert reqs[i].num_cached_tokens >= want, (i, len(p), reqs[i].num_cached_tokens, want)
        assert reqs[i].num_cached_tokens % B == 0
        if want:
            event("second pass: hits required")

    # one batch slot, prefix caching on (hits across requests, evictions from a one-request pool)
    check(make_llm(model, max_num_seqs=1, enable_prefix_caching=True, **kw))

    # a pool just above the largest request's need: preemption
    nb = max(need) + 1
    llm = make_llm(model, max_num_seqs=16, num_blocks=nb, enable_prefix_caching=preempt_prefix,
                   **kw)
    check(llm)
    if _preemption_forced(prompts, max_tokens, stop, kk, B, nb, 16):
        event("preemption forced")
        assert llm.engine.num_preemptions > 0
    event(f"preempted: {llm.engine.num_preemptions > 0}")
    event(f"spec: {name}")


# ---- 2. draft-module KV exact through the engine ------------------------------------------------
@pytest.mark.parametrize("spec,k", [("mtp1", 3), ("mtp8", 4), ("mtp8", 2)])
def test_engine_drafts_exact_with_prefix_caching_chunking_preemption(trained_tiny, spec, k):
    model = trained_tiny
    prompts = shared_prefix_prompts()
    max_tokens = [9, 14, 5, 12, 10, 3, 13, 8]
    params = [_params(t) for t in max_tokens]
    # one block above the largest request's need: both passes preempt (hits relieve the pool)
    nb = max(blocks_needed(len(p), t, k, 4) for p, t in zip(prompts, max_tokens)) + 1
    llm = make_llm(model, spec, k, max_num_seqs=4, block_size=4, num_blocks=nb,
                   enable_prefix_caching=True, max_num_batched_tokens=8)
    checked = install_draft_check(llm, model, spec, k)
    run_checked(llm, model, prompts, params)
    preemptions = llm.engine.num_preemptions
    _, reqs = run_checked(llm, model, prompts, params)
    bad = [c[1:] for c in checked if not c[0]]
    assert not bad, bad[:3]
    assert len(checked) > 50
    assert preemptions > 0 and llm.engine.num_preemptions > preemptions
    assert sum(r.num_cached_tokens for r in reqs.values()) > 0


# ---- 3. each prefix-caching mechanism is needed -------------------------------------------------
@pytest.mark.parametrize("broken", [False, True])
def test_write_side_lookahead_is_needed(trained_tiny, broken):
    """Publishing blocks whose last positions hold draft-module KV that read draft tokens (blocks
    not keyed on the tokens after them) lets a re-prefill write into a published block."""
    model = trained_tiny
    prompts = shared_prefix_prompts()
    params = [_params(16) for _ in prompts]
    llm = make_llm(model, "mtp8", 4, max_num_seqs=4, block_size=4, enable_prefix_caching=True)
    if broken:
        llm.engine.kv.num_lookahead_tokens = 0           # the manager's knob: keys without lookahead
        llm.engine.scheduler.num_lookahead_tokens = 0     # (and every request's)
        llm.engine.speculator.num_final = lambda row, n: n  # and no module bound on the write side
        with pytest.raises(AssertionError, match="write into published prefix-cache blocks"):
            for _ in range(2):
                llm.generate(prompts, params)
    else:
        for _ in range(2):
            run_checked(llm, model, prompts, params)


def _read_side_workload():
    """Pass 1 publishes prefixes; pass 2's prompts share them up to a block boundary, then differ,
    so a hit keyed without lookahead serves draft-module KV that read pass 1's tokens."""
    a = [(5 + 3 * i) % 60 + 2 for i in range(24)]
    b = [(17 * i + 11) % 64 for i in range(24)]
    c = [(29 * i + 3) % 64 for i in range(24)]
    first = [a[:8] + [50, 51, 52, 53, 54, 55], b[:12] + [20, 21, 22, 23, 24],
             c[:16] + [30, 31, 32, 33, 34]]
    second = [a[:8] + [1, 60, 3, 47, 5, 9], b[:12] + [44, 2, 61, 8, 13],
              c[:16] + [12, 57, 6, 39, 28]]
    return first, second


@pytest.mark.parametrize("broken", [False, True])
def test_read_side_lookahead_key_is_needed(trained_tiny, broken):
    model = trained_tiny
    first, second = _read_side_workload()
    p1, p2 = [_params(10) for _ in first], [_params(10) for _ in second]
    llm = make_llm(model, "mtp8", 4, max_num_seqs=4, block_size=4, enable_prefix_caching=True)
    if broken:
        llm.engine.kv.num_lookahead_tokens = 0           # blocks keyed on their own tokens only
        llm.engine.scheduler.num_lookahead_tokens = 0
    run_checked(llm, model, first, p1)
    checked = install_draft_check(llm, model, "mtp8", 4)
    _, reqs = run_checked(llm, model, second, p2)       # greedy stays lossless either way
    assert sum(r.num_cached_tokens for r in reqs.values()) > 0
    mismatches = [c for c in checked if not c[0]]
    assert len(checked) > 10
    if not broken:
        assert not mismatches, [c[1:] for c in mismatches[:3]]
        return
    assert mismatches, "hits keyed without lookahead went unnoticed"
    # a prompt ending within k tokens of such a hit: module k's first drafting round
    # re-prefills positions inside the hit, which the guard reports
    a = first[0][:8]
    with pytest.raises(AssertionError, match="write into published prefix-cache blocks"):
        llm.generate([a + [33, 14]], [_params(4)])


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp8", 4)])
def test_hybrid_boundary_states_are_needed(trained_tiny, spec, k):
    """A hit resumes the Gated DeltaNet recurrence from the state stored with the last hit block:
    the second pass equals plain decoding; zeroing the stored states changes the logits."""
    model = trained_tiny
    prompts = shared_prefix_prompts()
    params = [_params(8) for _ in prompts]
    plain = LLM(model=model, record_logit_gaps=True, check_invariants=True)
    _, plain_outs, _ = generate(plain, prompts, params)
    ref_gaps = [o.logit_gaps for o in plain_outs]
    assert [o.output_token_ids for o in plain_outs] == reference(model, prompts, params)
    second = {}
    for zero in (False, True):
        llm = make_llm(model, spec, k, block_size=4, enable_prefix_caching=True,
                       record_logit_gaps=True)
        assert llm.engine.cache.recurrent and all(
            c.block_ssm is not None for c in llm.engine.cache.recurrent)
        generate(llm, prompts, params)
        if zero:
            for c in llm.engine.cache.recurrent:
                c.block_ssm.zero_()
        _, outs, reqs = generate(llm, prompts, params)
        assert sum(r.num_cached_tokens for r in reqs.values()) > 0
        second[zero] = ([o.output_token_ids for o in outs], [o.logit_gaps for o in outs])
    (out_ok, g_ok), (out_zero, g_zero) = second[False], second[True]
    assert out_ok == [o.output_token_ids for o in plain_outs]
    for a, b in zip(g_ok, ref_gaps):
        assert a == pytest.approx(b, rel=GAP_TOL, abs=GAP_TOL)
    gaps_changed = any(len(a) != len(b) or any(abs(x - y) > 100 * GAP_TOL for x, y in zip(a, b))
                       for a, b in zip(g_zero, g_ok))
    changed = out_zero != out_ok or gaps_changed
    assert changed, "zeroing the stored boundary states changed nothing"


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp1", 2), ("mtp8", 4)])
def test_hits_on_blocks_completed_by_decode(trained_tiny, spec, k):
    """Blocks filled by verification windows (KV, Gated DeltaNet boundary states from the accepted
    position, draft-module KV after re-prefills) are published and reusable: prompts that extend a
    finished request's prompt + output hit well past the original prompt and decode exactly."""
    model = trained_tiny
    first = [[(5 + 3 * i) % 60 + 2 for i in range(6)], [(17 * i + 11) % 64 for i in range(5)],
             [9, 33, 2, 50, 18, 7, 41]]
    p1 = [_params(24) for _ in first]
    ref1 = reference(model, first, p1)
    second = [p + out + [(7 * i) % 64] for i, (p, out) in enumerate(zip(first, ref1))]
    p2 = [_params(8) for _ in second]
    llm = make_llm(model, spec, k, max_num_seqs=4, block_size=4, enable_prefix_caching=True)
    run_checked(llm, model, first, p1)
    checked = install_draft_check(llm, model, spec, k) if spec else None
    _, reqs = run_checked(llm, model, second, p2)
    for i, p in enumerate(first):
        assert reqs[i].num_cached_tokens >= -(-len(p) // 4) * 4 + 8, (i, reqs[i].num_cached_tokens)
    if checked is not None:
        assert checked and all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:3]


# ---- 4. preemption ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,k,prefix", [(None, None, False), ("mtp1", 2, True),
                                           ("mtp8", 4, False), ("mtp8", 3, True)])
def test_preemption_small_pool(trained_tiny, spec, k, prefix):
    model = trained_tiny
    prompts = shared_prefix_prompts()
    max_tokens = [16, 20, 12, 18, 20, 10, 16, 14]
    params = [_params(t) for t in max_tokens]
    kk = 0 if spec is None else k
    nb = max(blocks_needed(len(p), t, kk, 4) for p, t in zip(prompts, max_tokens)) + 2
    llm = make_llm(model, spec, k, max_num_seqs=8, block_size=4, num_blocks=nb,
                   enable_prefix_caching=prefix)
    _, reqs = run_checked(llm, model, prompts, params)
    assert llm.engine.num_preemptions > 0
    assert sum(r.num_preemptions for r in reqs.values()) == llm.engine.num_preemptions


# ---- 5. abort -----------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,k,prefix,budget", [
    (None, None, False, 2048), ("mtp8", 4, False, 2048), ("mtp1", 2, False, 2048),
    ("mtp8", 4, True, 2048), ("mtp8", 3, True, 8)])
def test_abort_running_request(trained_tiny, spec, k, prefix, budget):
    """Abort after the victim's 2nd step (with budget 8 it is still prefilling its prompt in
    chunks then); with prefix caching, later requests sharing its prefix hit the blocks it
    published when aborted."""
    model = trained_tiny
    c = [(29 * i + 3) % 64 for i in range(30)]
    prompts = shared_prefix_prompts()[:4] + [c, c[:20] + [5, 6], c[:12]]
    params = [_params(t) for t in (12, 14, 10, 9, 24, 6, 7)]
    ref = reference(model, prompts, params)
    victim, seen = 4, {"steps": 0, "done": False, "prefilling": None}

    def on_step(engine):
        if seen["done"]:
            return
        [r] = [r for r in engine.scheduler.running if r.index == victim] or [None]
        if r is None:
            return
        seen["steps"] += 1
        if seen["steps"] < 2:
            return
        table = list(engine.kv.block_table(r.index))
        owned = sum(1 for b in table if engine.kv.pool.ref_cnt[b] == 1)
        free, rows = engine.kv.num_free_blocks, engine.cache.num_free_rows()
        assert table and not r.finished
        seen["prefilling"] = r.is_prefilling
        engine.abort(r)
        assert engine.kv.block_table(r.index) == []
        assert engine.kv.num_free_blocks == free + owned > free
        assert engine.cache.num_free_rows() == rows + 1 and r.index not in engine.runner.rows
        assert r not in engine.scheduler.running
        engine.abort(r)                                  # a second abort is a no-op
        assert engine.kv.num_free_blocks == free + owned
        seen["done"] = True

    llm = make_llm(model, spec, k, max_num_seqs=4, block_size=4, enable_prefix_caching=prefix,
                   max_num_batched_tokens=budget)
    reqs = {}
    outs = llm.generate(prompts, params, on_step=on_step,
                        on_finish=lambda r: reqs.__setitem__(r.index, r))
    assert_clean(llm)
    assert seen["done"] and seen["prefilling"] == (budget < 2048)
    assert outs[victim].finish_reason == "abort" and reqs[victim].finish_reason == "abort"
    got = outs[victim].output_token_ids
    assert len(got) < len(ref[victim]) and got == ref[victim][: len(got)]
    assert budget < 2048 or len(got) >= 1
    if prefix:   # requests sharing the victim's prefix reuse blocks it published
        assert reqs[5].num_cached_tokens > 0 and reqs[6].num_cached_tokens > 0
    for i, o in enumerate(outs):
        if i != victim:
            assert o.finish_reason == "length" and o.output_token_ids == ref[i]


def test_abort_waiting_request(trained_tiny):
    model = trained_tiny
    prompts = shared_prefix_prompts()[:3]
    params = [_params(6) for _ in prompts]
    ref = reference(model, prompts, params)

    def on_step(engine):
        for r in list(engine.scheduler.waiting):
            if r.index == 2:
                engine.abort(r)

    llm = make_llm(model, "mtp8", 4, max_num_seqs=1, block_size=4, enable_prefix_caching=True)
    outs = llm.generate(prompts, params, on_step=on_step)
    assert_clean(llm)
    assert outs[2].finish_reason == "abort" and outs[2].output_token_ids == []
    assert [o.output_token_ids for o in outs[:2]] == ref[:2]


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp8", 2)])
def test_abort_from_on_finish_of_a_prefill(trained_tiny, spec, k):
    """A request that finishes with its last prefill chunk aborts, from its on_finish, a request
    scheduled to decode in the same step: the step skips the aborted request and goes on."""
    prompts = [[5, 8], list(range(2, 22))]           # 0 decodes while 1 is prefilled in chunks
    params = [SamplingParams(max_tokens=40, ignore_eos=True), SamplingParams(max_tokens=1, ignore_eos=True)]
    llm = make_llm(trained_tiny, spec, k, max_num_seqs=2, block_size=4, max_num_batched_tokens=8)
    steps = []

    def on_finish(r):
        if r.index == 1:
            steps.append(llm.engine.num_steps)
            running = [x for x in llm.engine.scheduler.running if x.index == 0]
            if running:
                llm.engine.abort(running[0])

    outs = llm.generate(prompts, params, on_finish=on_finish)
    assert_clean(llm)
    assert steps and steps[0] > 1                      # request 1 ended after several steps
    assert outs[0].finish_reason == "abort" and 0 < len(outs[0].output_token_ids) < 40
    assert len(outs[1].output_token_ids) == 1


# ---- 6. chunked prefill -------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("spec,k,budget", [(None, None, 8), ("mtp1", 3, 6), ("mtp8", 4, 8)])
def test_chunked_prefill(trained_tiny, spec, k, budget, prefix):
    model = trained_tiny
    a = [(7 * i + 1) % 64 for i in range(40)]
    prompts = [a[:37], a[:24] + [3, 4, 5], [(11 * i) % 64 for i in range(30)], a[:9], [5]]
    params = [_params(t) for t in (10, 12, 7, 9, 4)]
    chunked = []

    def on_step(engine):   # a request with part of its prompt computed: a chunk boundary
        chunked.extend(r.index for r in engine.scheduler.running
                       if 0 < r.num_computed_tokens < len(r.prompt_token_ids) - 1)

    llm = make_llm(model, spec, k, max_num_seqs=4, block_size=4, max_num_batched_tokens=budget,
                   enable_prefix_caching=prefix)
    run_checked(llm, model, prompts, params, on_step)
    assert {0, 2} <= set(chunked)                  # (1 may hit 0's blocks, published mid-prefill)
    assert prefix or 1 in chunked
    if prefix:
        _, reqs = run_checked(llm, model, prompts, params, on_step)
        assert reqs[0].num_cached_tokens > 0


# ---- 7. a request too large for the pool --------------------------------------------------------
@pytest.mark.parametrize("spec,k", [(None, None), ("mtp8", 4)])
def test_request_too_large_for_pool_fails_alone(trained_tiny, spec, k):
    model = trained_tiny
    prompts = shared_prefix_prompts()[:4]
    max_tokens = [8, 200, 6, 10]
    params = [_params(t) for t in max_tokens]
    kk = 0 if spec is None else k
    nb = max(blocks_needed(len(p), t, kk, 4) for p, t in zip(prompts, max_tokens) if t < 100) + 1
    assert blocks_needed(len(prompts[1]), 200, kk, 4) > nb
    llm = make_llm(model, spec, k, max_num_seqs=4, block_size=4, num_blocks=nb)
    _, outs, reqs = generate(llm, prompts, params, allow_errors=True)
    bad = outs[1]
    assert bad.error is not None and "engine.num_blocks" in bad.error and str(nb) in bad.error
    assert bad.finish_reason is None and bad.output_token_ids == []
    assert reqs[1].error == bad.error                   # on_finish saw it too
    ok = [0, 2, 3]
    assert [outs[i].output_token_ids for i in ok] == reference(model, [prompts[i] for i in ok],
                                                               [params[i] for i in ok])
    assert all(outs[i].error is None and outs[i].finish_reason == "length" for i in ok)


# ---- 8. paged vs contiguous ---------------------------------------------------------------------
@pytest.mark.parametrize("spec,k", [(None, None), ("mtp1", 2), ("mtp8", 4)])
def test_paged_equals_contiguous(trained_tiny, spec, k):
    """One block per request (block_size >= the row length: the contiguous cache as a block size)
    and 4-token blocks emit the same tokens and logit gaps as the reference."""
    model = trained_tiny
    prompts = shared_prefix_prompts()[:6]
    params = [_params(t) for t in (9, 14, 5, 11, 7, 12)]
    contiguous = make_llm(model, spec, k, max_num_seqs=4, max_model_len=64, block_size=80,
                          max_num_batched_tokens=256)
    assert contiguous.engine.cache.max_blocks == 1
    run_checked(contiguous, model, prompts, params)
    run_checked(make_llm(model, spec, k, max_num_seqs=4, block_size=4), model, prompts, params)


# ---- 9. freeing side ----------------------------------------------------------------------------
def test_freeing_side_blocks_outlive_the_last_draft_write(trained_tiny):
    """Invariant 5: a request's blocks go back to the pool only once nothing will write into them.
    The scheduler frees a finished request's blocks in update_from_output, after the runner's whole
    step (its draft loop re-prefills the last positions of every verified request, finishing ones
    included). Freeing them before the draft loop would let the re-prefill write into freed
    blocks: the write guard catches that."""
    model = trained_tiny
    prompts = shared_prefix_prompts()[:4]
    params = [_params(t) for t in (6, 9, 4, 7)]
    run_checked(make_llm(model, "mtp8", 4, max_num_seqs=4, block_size=4), model, prompts, params)
    llm = make_llm(model, "mtp8", 4, max_num_seqs=4, block_size=4)
    spec, kv = llm.engine.speculator, llm.engine.kv
    propose = spec.propose

    def free_first(cache, batch, *args, **kw):   # a request's blocks freed too early
        for r in list(llm.engine.scheduler.running):
            if r.output_token_ids and kv.block_table(r.index):
                kv.free(r.index)
                break
        return propose(cache, batch, *args, **kw)

    spec.propose = free_first
    with pytest.raises(AssertionError, match="write into free KV blocks"):
        llm.generate(prompts, params)
