"""What the prefix cache holds (docs/architecture.md, invariant 4): every published block's target KV,
draft-module KV and Gated DeltaNet boundary state equal a from-scratch computation over the
committed tokens its key covers, after every engine step; every proposal equals a from-scratch
chain.

A block is keyed on its tokens, every token before it and the num_lookahead_tokens tokens after it
(mtpx.core.kv_cache_manager), so the key names the exact token sequence its content must have
been computed from: the checker rebuilds every key from the requests' committed tokens and
compares the block with that sequence's from-scratch values. A published key that no committed
sequence produces is an error too.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings, strategies as st

from mtpx.core.block_pool import hash_block, lookahead_key
from mtpx.cache.model_cache import ModelCache
from mtpx.attention.kv_cache import KVCache
from mtpx.spec_decode.common import run_module
from tests.helpers import peaked_model, tiny_config
from tests.helpers import _params, assert_clean, assert_matches_reference, install_draft_check, make_llm

ATOL = 1e-9   # float64 models: incremental (paged, batched) vs from-scratch rounding


def block_keys(seq: list[int], S: int, L: int) -> dict[bytes, tuple[tuple[int, ...], int]]:
    """{publish key: (the tokens it covers, block index)} of every full block of `seq` whose L
    lookahead tokens are in `seq`, computed independently of the manager."""
    out, chain = {}, None
    for i in range(len(seq) // S):
        chain = hash_block(chain, seq[i * S:(i + 1) * S])
        end = (i + 1) * S
        if end + L <= len(seq):
            key = lookahead_key(chain, seq[end:end + L]) if L else chain
            out[key] = (tuple(seq[:end + L]), i)
    return out


_REFERENCE: dict = {}


def reference_block(model, tokens: tuple[int, ...], i: int, S: int, num_modules: int):
    """From-scratch contents of block i of `tokens` (its (i+1)*S tokens and num_lookahead after):
    ([(k, v) per target attention layer], [(conv, ssm) per Gated DeltaNet layer: the state after
    the block's last token], [(k, v) per draft module]), each [S, ...]; memoized."""
    key = (id(model), tokens, i, S, num_modules)
    if key in _REFERENCE:
        return _REFERENCE[key]
    end = (i + 1) * S
    cache = ModelCache(model, rows=1, max_len=len(tokens) + S, num_draft_modules=num_modules,
                       block_size=S).static_block_tables()
    rows = torch.tensor([0])
    with torch.no_grad():
        model.model(torch.tensor([tokens[:end]]), cache.meta(torch.tensor([0]), torch.tensor([end]), rows),
                    cache.target)
        target = [(c.k[i].clone(), c.v[i].clone()) for c in cache.target if isinstance(c, KVCache)]
        states = [(c.conv[0].clone(), c.ssm[0].clone()) for c in cache.recurrent]
        n = len(tokens) - 1                   # module k at j reads x_{j+k}: j <= n - k
        cache.tokens[0, : n + 1] = torch.tensor(tokens)
        a = model.model(torch.tensor([tokens[:n]]))
        for k in range(1, num_modules + 1):
            meta = cache.meta(torch.tensor([0]), torch.tensor([n - k + 1]), rows)
            a = run_module(model, cache, k, meta, a[:, : n - k + 1])
        draft = [(c.k[i].clone(), c.v[i].clone()) for c in cache.draft]
    _REFERENCE[key] = (target, states, draft)
    return _REFERENCE[key]


class PublishedBlockChecker:
    """on_step / on_finish callbacks: after every engine step, every published block (referenced
    or free-but-cached) is compared with the from-scratch values of the sequence its key covers.
    `sequences` keeps the committed tokens of every request seen (finished ones too)."""

    def __init__(self, llm, model):
        self.llm, self.model = llm, model
        eng = llm.engine
        self.S = eng.config.block_size
        spec = eng.speculator
        self.L = 0 if spec is None else spec.num_lookahead_tokens
        self.num_modules = 0 if spec is None else spec.num_draft_modules
        self.sequences: set[tuple[int, ...]] = set()
        self.num_checked = 0
        self.checked_keys: set[bytes] = set()

    def on_finish(self, r) -> None:
        self.sequences.add(tuple(r.all_token_ids))

    def on_step(self, engine) -> None:
        for r in engine.scheduler.running + list(engine.scheduler.waiting):
            self.sequences.add(tuple(r.all_token_ids))
        self.check(engine)

    def check(self, engine) -> None:
        keys = {}
        for seq in self.sequences:
            keys.update(block_keys(list(seq), self.S, self.L))
        pool, cache = engine.kv.pool, engine.cache
        for b, h in enumerate(pool.block_hash):
            if h is None:
                continue
            assert h in keys, f"block {b} is published under a key no committed token sequence has"
            tokens, i = keys[h]
            target, states, draft = reference_block(self.model, tokens, i, self.S, self.num_modules)
            got_kv = [c for c in cache.target if isinstance(c, KVCache)]
            for layer, (c, (k, v)) in enumerate(zip(got_kv, target)):
                torch.testing.assert_close(c.k[b], k, atol=ATOL, rtol=0,
                                           msg=f"block {b} target layer {layer} keys differ")
                torch.testing.assert_close(c.v[b], v, atol=ATOL, rtol=0)
            if engine.runner.boundary_states:
                for c, (conv, ssm) in zip(cache.recurrent, states):
                    torch.testing.assert_close(c.block_conv[b], conv, atol=ATOL, rtol=0)
                    torch.testing.assert_close(c.block_ssm[b], ssm.to(c.block_ssm.dtype), atol=ATOL, rtol=0)
            for m, (c, (k, v)) in enumerate(zip(cache.draft, draft)):
                torch.testing.assert_close(
                    c.k[b], k, atol=ATOL, rtol=0,
                    msg=f"block {b} (block {i} of {list(tokens)}) draft module {m + 1} keys differ")
                torch.testing.assert_close(c.v[b], v, atol=ATOL, rtol=0)
            self.num_checked += 1
            self.checked_keys.add(h)

    def generate(self, prompts, params):
        outs = self.llm.generate(prompts, params, on_finish=self.on_finish, on_step=self.on_step)
        assert_clean(self.llm)
        assert all(o.error is None and o.finish_reason in ("stop", "length") for o in outs)
        self.check(self.llm.engine)
        return outs


@pytest.fixture(scope="module")
def issue_model():
    """The float64 tiny hybrid of the report (linear, full, linear, full; lm_head x 20)."""
    return peaked_model(tiny_config())


# ---- the two reports, as tests -----------------------------------------------------------------
def test_finishing_request_publishes_no_module_kv_read_from_a_rejected_draft(issue_model):
    """F1: the last round drafts 1 token and accepts none, so module 4's KV at position 3 read the
    rejected draft, and the request ends in that step. Block 0 (keyed on the 4 tokens after it)
    may be published only with module KV re-prefilled from the committed bonus token: the
    runner's draft loop repairs it before the scheduler publishes, and the checker compares
    every published block with its from-scratch values."""
    llm = make_llm(issue_model, "mtp8", 4, block_size=4, enable_prefix_caching=True)
    checker = PublishedBlockChecker(llm, issue_model)
    out = checker.generate([[7, 10, 13, 16, 19]], [_params(3)])[0]
    assert out.spec.rounds[-1][:2] == (1, 0)
    assert len(out.prompt_token_ids + out.output_token_ids) == 8
    assert checker.num_checked > 0 and llm.engine.kv.pool.num_cached_blocks == 1   # block 0


def test_hit_serves_module_kv_of_this_requests_own_continuation(issue_model):
    """F2: three requests share 3 blocks of prefix; the first continues differently. The third
    hits blocks published by the second (and block 2's module KV must come from the second's
    continuation, not the first's): its drafts equal the from-scratch chain and plain decoding."""
    P = [7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 37, 40]
    a, b = P + [35, 14, 47, 61, 38, 54], P + [43, 46, 49, 52, 55, 58]
    llm = make_llm(issue_model, "mtp8", 2, block_size=4, enable_prefix_caching=True, max_num_seqs=1)
    checker = PublishedBlockChecker(llm, issue_model)
    checker.generate([a], [_params(6)])
    checker.generate([b], [_params(6)])
    drafts = install_draft_check(llm, issue_model, "mtp8", 2)
    out = checker.generate([b], [_params(6)])[0]
    assert out.num_cached_tokens >= 12
    bad = [c[1:] for c in drafts if not c[0]]
    assert drafts and not bad, bad[:3]
    assert_matches_reference(issue_model, [out], [b], [_params(6)])


# ---- the property test -------------------------------------------------------------------------
@st.composite
def workloads(draw):
    """Two passes of prompts cut from a few bases at block boundaries, inside blocks and a token
    or two after a boundary, with suffixes (shared prefixes that diverge everywhere); per-request
    max_tokens 1-12 and an optional stop token (requests end at every point of an accepted run)."""
    S = draw(st.sampled_from([2, 4, 8]))
    bases = draw(st.lists(st.lists(st.integers(0, 63), min_size=24, max_size=24), min_size=1, max_size=2))
    passes = []
    for _ in range(2):
        n = draw(st.integers(1, 5))
        prompts = []
        for _ in range(n):
            base = bases[draw(st.integers(0, len(bases) - 1))]
            cut = draw(st.one_of(st.integers(0, 24), st.sampled_from([S, 2 * S, 2 * S + 1, 3 * S - 1])))
            cut = min(cut, 24)
            suffix = draw(st.lists(st.integers(0, 63), min_size=0 if cut else 1, max_size=6))
            prompts.append(base[:cut] + suffix)
        max_tokens = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
        passes.append((prompts, max_tokens))
    stop = draw(st.one_of(st.none(), st.integers(0, 63)))
    return S, passes, stop


SPECS = st.sampled_from([("mtp1", 1), ("mtp1", 3), ("mtp8", 2), ("mtp8", 4)])


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(w=workloads(), spec=SPECS, max_num_seqs=st.sampled_from([1, 2, 4]))
def test_published_blocks_equal_from_scratch(trained_tiny, w, spec, max_num_seqs):
    model = trained_tiny
    S, passes, stop = w
    name, k = spec
    llm = make_llm(model, name, k, block_size=S, enable_prefix_caching=True, max_num_seqs=max_num_seqs)
    checker = PublishedBlockChecker(llm, model)
    drafts = install_draft_check(llm, model, name, k)
    for prompts, max_tokens in passes:
        params = [_params(t, stop) for t in max_tokens]
        outs = checker.generate(prompts, params)
        assert_matches_reference(model, outs, prompts, params)
    bad = [c[1:] for c in drafts if not c[0]]
    assert not bad, bad[:3]
    event(f"blocks checked > 0: {checker.num_checked > 0}")
    event(f"hits: {sum(o.num_cached_tokens for o in outs) > 0}")


def test_checker_catches_a_stale_block(issue_model):
    """The checker is not vacuous: a published block whose draft-module KV is overwritten fails."""
    llm = make_llm(issue_model, "mtp8", 2, block_size=4, enable_prefix_caching=True)
    checker = PublishedBlockChecker(llm, issue_model)
    checker.generate([[7, 10, 13, 16, 19, 22, 25, 28, 31, 34]], [_params(8)])
    cached = llm.engine.kv.pool.cached_hashes()
    assert cached and checker.num_checked > 0
    b = next(iter(cached.values()))
    llm.engine.cache.draft[1].k[b, -1] += 1e-6
    with pytest.raises(AssertionError, match="draft module 2 keys"):
        checker.check(llm.engine)
