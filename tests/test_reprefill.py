"""Re-prefill (invariant 2): after any sequence of accepts and rejects, every draft module's KV and
kept hidden states at the positions a later step reads equal their from-scratch values."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from mtpx.attention.torch_backend import gather_kv
from mtpx.cache.model_cache import ModelCache
from mtpx.spec_decode import MultiModuleMTPSpeculator, SingleModuleMTPSpeculator
from mtpx.spec_decode.common import run_module
from tests.helpers import peaked_model, tiny_config
from tests.helpers import install_draft_check, propose

K = 4


def kv_at(cache: ModelCache, module: int, row: int, n: int):
    """Draft module `module`'s (0-based) keys and values at positions 0..n-1 of `row`, [n, Hkv, D]."""
    k, v = gather_kv(cache.draft[module], cache.block_tables[[row]], n)
    return k[0], v[0]


def _reference_kv(model, tokens: list[int], num_modules: int):
    """Draft-module KV from scratch on the final tokens x_0..x_n: module k over j = 0..n-k."""
    n = len(tokens) - 1
    cache = ModelCache(model, rows=1, max_len=len(tokens) + K + 2, num_draft_modules=num_modules,
                       block_size=8).static_block_tables()
    cache.tokens[0, : n + 1] = torch.tensor(tokens)
    rows = torch.tensor([0])
    a = model.model(torch.tensor([tokens[:n]]))
    for k in range(1, num_modules + 1):
        meta = cache.meta(torch.tensor([0]), torch.tensor([n - k + 1]), rows)
        a = run_module(model, cache, k, meta, a[:, : n - k + 1])
    return cache


def module_progress(spec, row: int, num_tokens: int, depth: int) -> list[int]:
    """Per module m = 1..depth: the positions [0, P_m) whose KV the module computed from known
    tokens (x_{j+m} known: j < num_tokens - m; mtp1: its one module, j < num_tokens - 1)."""
    if spec.num_draft_modules == 1 and spec.computed.dim() == 1:
        return [min(int(spec.computed[row]), num_tokens - 1)]
    return [min(int(spec.computed[row, m - 1]), num_tokens - m) for m in range(1, depth + 1)]


def assert_module_kv_exact(engine, mdl, current: bool) -> None:
    """Every running request's module KV at every position its modules computed equals the
    from-scratch KV (to 1e-10, float64); current: every module reached the last position its
    inputs allow (num_tokens - m), as after a drafting step."""
    spec = engine.speculator
    for r in engine.scheduler.running:
        if r.index not in engine.runner.rows or not r.output_token_ids:
            continue
        seq, row = r.all_token_ids, engine.runner.rows[r.index]
        depth = min(r.draft_depth, spec.num_draft_modules)
        progress = module_progress(spec, row, len(seq), depth)
        ref = _reference_kv(mdl, seq, len(progress))
        for m, p in enumerate(progress):
            for got, want in zip(kv_at(engine.cache, m, row, p), kv_at(ref, m, 0, p)):
                torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
        if current:
            assert progress == [len(seq) - 1 if len(progress) == 1 and spec.computed.dim() == 1
                                else len(seq) - m for m in range(1, len(progress) + 1)], (progress, len(seq))


def _drive(model, speculator, prompts, scripts):
    """Run propose/verify rounds where round r of request b accepts scripts[b][r] drafts and the
    bonus token is chosen to differ from the next draft (a real rejection)."""
    B = len(prompts)
    max_len = 128
    cache = ModelCache(model, rows=B + 1, max_len=max_len, num_draft_modules=speculator.num_draft_modules,
                       block_size=16).static_block_tables()
    speculator.allocate(cache)
    rows = torch.arange(1, B + 1)                    # row 0 unused: rows need not start at 0
    speculator.reset_rows(rows)
    seqs = [list(p) for p in prompts]
    lens = torch.tensor([len(p) for p in prompts])
    meta = cache.meta(torch.zeros(B, dtype=torch.long), lens, rows)
    ids = torch.zeros(meta.valid.shape, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p)
        seqs[b].append((7 * b + 3) % 64)             # the first output token
        cache.tokens[rows[b], : len(seqs[b])] = torch.tensor(seqs[b])
    h = model.model(ids, meta, cache.target)
    drafts = propose(speculator, cache, rows, lens + 1, meta, h)
    history = [([list(x) for x in seqs], drafts.clone())]
    for r in range(len(scripts[0])):
        n = torch.tensor([len(s) - 1 for s in seqs])
        acc = torch.tensor([min(scripts[b][r], speculator.num_speculative_tokens) for b in range(B)])
        for b in range(B):
            m = int(acc[b])
            new = drafts[b, :m].tolist()
            nxt = int(drafts[b, m]) if m < speculator.num_speculative_tokens else -1
            new.append((nxt + 1 + r) % 64 if nxt >= 0 else (5 * r + b) % 64)
            seqs[b] += new
            cache.tokens[rows[b], : len(seqs[b])] = torch.tensor(seqs[b])
        # the target's hidden states at the newly verified positions n..n+m, from scratch
        new_meta = cache.meta(n, acc + 1, rows)
        T = new_meta.valid.shape[1]
        h = torch.zeros(B, T, model.cfg.hidden_size, dtype=torch.float64)
        for b in range(B):
            full = model.model(torch.tensor([seqs[b][:-1]]))[0]
            h[b, : acc[b] + 1] = full[n[b]: n[b] + acc[b] + 1]
        drafts = propose(speculator, cache, rows, torch.tensor([len(s) for s in seqs]), new_meta, h)
        history.append(([list(x) for x in seqs], drafts.clone()))
    _drive.history = history
    return cache, rows, seqs


@pytest.mark.parametrize("scripts", [
    [[0, 3, 1, 4, 0, 2, 2], [4, 0, 0, 1, 3, 4, 1]],
    [[1, 1, 1, 1, 1, 1, 1], [2, 0, 4, 4, 0, 0, 3]],
])
def test_multi_module_kv_equals_from_scratch(scripts):
    model = peaked_model(tiny_config())
    spec = MultiModuleMTPSpeculator(model, K)
    prompts = [[5, 9, 13, 2, 40, 41], [17, 3]]
    cache, rows, seqs = _drive(model, spec, prompts, scripts)
    for b, seq in enumerate(seqs):
        n = len(seq) - 1
        ref = _reference_kv(model, seq, K)
        chain = model.mtp_chain(torch.tensor([seq]), model.model(torch.tensor([seq])), K)
        for k in range(1, K + 1):
            final = n - k + 1                        # positions j <= n-k read only known tokens
            for got, want in zip(kv_at(cache, k - 1, int(rows[b]), final), kv_at(ref, k - 1, 0, final)):
                torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
            if k < K:  # the window of module outputs holds the final values of the last positions
                W = spec.window.window
                for p in range(max(0, n - W), final):
                    torch.testing.assert_close(spec.window.buf[k - 1][rows[b], p % W], chain[k - 1][0, p],
                                               atol=1e-10, rtol=0)


def test_stale_kv_is_detected_without_reprefill():
    """The test above fails if module k only processes the new positions (no re-prefill)."""
    model = peaked_model(tiny_config())
    spec = MultiModuleMTPSpeculator(model, K, reprefill=False)   # start_k = computed_k
    cache, rows, seqs = _drive(model, spec, [[5, 9, 13, 2, 40, 41]], [[0, 3, 1, 0, 2]])
    seq = seqs[0]
    ref = _reference_kv(model, seq, K)
    final = len(seq) - 1 - K + 1
    assert not torch.allclose(kv_at(cache, K - 1, int(rows[0]), final)[0], kv_at(ref, K - 1, 0, final)[0])


def test_single_module_kv_equals_from_scratch():
    model = peaked_model(tiny_config())
    spec = SingleModuleMTPSpeculator(model, 3)
    cache, rows, seqs = _drive(model, spec, [[5, 9, 13, 2], [1, 2, 3, 4, 5, 6, 7]],
                               [[0, 3, 1, 2, 0], [3, 3, 0, 1, 2]])
    for b, seq in enumerate(seqs):
        ref = _reference_kv(model, seq, 1)
        n = len(seq) - 1
        torch.testing.assert_close(kv_at(cache, 0, int(rows[b]), n)[0], kv_at(ref, 0, 0, n)[0],
                                   atol=1e-10, rtol=0)



@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scripts=st.lists(st.lists(st.integers(0, K), min_size=4, max_size=4), min_size=2, max_size=3),
       prompt_lens=st.lists(st.integers(1, 9), min_size=3, max_size=3))
def test_random_accept_patterns_keep_draft_kv_exact(scripts, prompt_lens):
    model = _MODEL
    spec = MultiModuleMTPSpeculator(model, K)
    prompts = [[(3 * i + 7 * b) % 64 for i in range(n)] for b, n in enumerate(prompt_lens[: len(scripts)])]
    cache, rows, seqs = _drive(model, spec, prompts, scripts)
    for b, seq in enumerate(seqs):
        ref = _reference_kv(model, seq, K)
        for k in range(1, K + 1):
            final = len(seq) - k
            torch.testing.assert_close(kv_at(cache, k - 1, int(rows[b]), final)[0],
                                       kv_at(ref, k - 1, 0, final)[0], atol=1e-10, rtol=0)


_MODEL = peaked_model(tiny_config())


def test_drafts_equal_from_scratch_chain():
    """Every round's drafts equal the argmax of a from-scratch module chain over
    x_0..x_n, d_1..d_{k-1} (module k at position n-1 reads d_{k-1})."""
    model = _MODEL
    spec = MultiModuleMTPSpeculator(model, K)
    _drive(model, spec, [[5, 9, 13, 2, 40, 41], [17, 3]], [[0, 3, 1, 4, 2], [4, 0, 2, 1, 3]])
    for seqs, drafts in _drive.history:
        for b, seq in enumerate(seqs):
            n = len(seq) - 1
            full = torch.tensor([seq + drafts[b, : K - 1].tolist()])
            chain = model.mtp_chain(full, model.model(full), K)
            want = [int(model.lm_head(chain[k - 1][0, n - 1]).argmax()) for k in range(1, K + 1)]
            assert drafts[b].tolist() == want


def test_single_module_drafts_equal_from_scratch():
    """mtp1 step i >= 2 runs module 0 at position n-2+i on its own previous output: compare with a
    from-scratch loop of the same recurrence."""
    model = _MODEL
    spec = SingleModuleMTPSpeculator(model, 3)
    _drive(model, spec, [[5, 9, 13, 2]], [[0, 3, 1, 2]])
    for seqs, drafts in _drive.history:
        seq = seqs[0]
        n = len(seq) - 1
        x = torch.tensor([seq])
        h = model.model(x)[:, :n]                                     # h_0..h_{n-1}
        emb = model.model.embed_tokens(x[:, 1:])                      # x_{j+1}
        want, hid = [], h
        pos = torch.arange(n)[None]
        a = model.mtp[0](emb, hid, pos)                               # no cache: causal over 0..n-1
        for _ in range(1, 4):
            d = int(model.lm_head(a[0, -1]).argmax())
            want.append(d)
            # extend by one position (n-2+i+1) reading d and the last output
            emb = torch.cat([emb, model.model.embed_tokens(torch.tensor([[d]]))], 1)
            hid = torch.cat([hid, a[:, -1:]], 1)
            pos = torch.arange(hid.shape[1])[None]
            a = model.mtp[0](emb, hid, pos)
        assert drafts[0].tolist() == want


@pytest.mark.parametrize("spec,k,slots", [("mtp8", 4, 3), ("mtp1", 3, 2)])
def test_engine_drafts_equal_from_scratch(trained_tiny, spec, k, slots):
    """Through the engine (row reuse, draft budgets, finished requests): every proposal equals the
    from-scratch drafts for the request's known tokens."""
    from mtpx import LLM, SamplingParams
    llm = LLM(model=trained_tiny, spec=spec, num_speculative_tokens=k, max_num_seqs=slots)
    checked = install_draft_check(llm, trained_tiny, spec, k)
    prompts = [[5, 8, 11], [20], [3, 4, 5, 6, 7, 8, 9, 10], [61, 2, 7, 33, 12], [9, 9]]
    llm.generate(prompts, [SamplingParams(max_tokens=t, ignore_eos=True) for t in (2, 12, 7, 15, 9)])
    assert len(checked) > 10 and all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:3]
