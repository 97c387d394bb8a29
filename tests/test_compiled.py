"""engine.compile (mtpx/engine/compiled.py): the static-shape decode step under torch.compile.

The default tests trace with torch.compile's "eager" backend (Dynamo captures the graphs, guards
and recompilations exactly as with Inductor, without generating code), so they check what
compilation changes (static shapes, padding, dynamic dimensions, no recompiles) in seconds. The
slow tests (`pytest -m slow`) compile with Inductor and compare logits and tokens to eager.
"""
import pytest
import torch

from mtpx import LLM, SamplingParams
from mtpx.cache.model_cache import ModelCache
from mtpx.engine.decode_step import block_bucket, capture_sizes
from mtpx.engine.warmup import warm_up
from mtpx.spec_decode.protocol import DraftBatch
from tests.helpers import peaked_model, tiny_config

PROMPTS = [[5, 8, 11, 14], [20], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [40, 42, 44],
           [9, 9, 9, 9, 9, 9, 9], [61, 2, 7, 33, 12], [30, 31], [50, 53, 56, 59, 62, 5, 8]]


def _llm(model, spec, k, compile_backend=None, max_num_seqs=4, **kw):
    """An LLM on `model`; compile_backend: None (eager) or the torch.compile backend."""
    return LLM(model=model, spec=spec, num_speculative_tokens=k, max_num_seqs=max_num_seqs,
               record_logit_gaps=True, compile=compile_backend is not None,
               compile_backend=compile_backend or "inductor", **kw)


def _generate(llm, prompts=PROMPTS, max_tokens=30, **params):
    ps = [SamplingParams(max_tokens=max_tokens - i % 5, ignore_eos=True, **params)
          for i in range(len(prompts))]
    return llm.generate(prompts, ps)


def _same(a, b):
    assert [o.output_token_ids for o in a] == [o.output_token_ids for o in b]
    assert [o.spec.rounds for o in a] == [o.spec.rounds for o in b]


def test_capture_sizes_and_block_buckets():
    assert capture_sizes(1) == [1]
    assert capture_sizes(4) == [1, 2, 4]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert [block_bucket(p, 16, 64) for p in (1, 32, 33, 64, 65, 200, 5000)] == [2, 2, 4, 4, 8, 16, 64]


def test_static_meta_attention_equals_dynamic(tiny_model):
    """The same forward through a static meta (padded batch and window, pad slot, whole block
    bucket) and a dynamic one: equal outputs, and the real rows' KV written identically."""
    torch.manual_seed(0)
    m = tiny_model
    caches = [ModelCache(m, rows=3, max_len=64, num_draft_modules=0, block_size=8).static_block_tables()
              for _ in range(2)]
    ids = torch.randint(0, 64, (3, 20))
    for c in caches:  # the same prefill of 20, 13 and 7 tokens
        meta = c.meta(torch.zeros(3, dtype=torch.long), torch.tensor([20, 13, 7]), torch.arange(3))
        m.model(torch.where(meta.valid, ids, 0), meta, c.target)
    starts, lengths, rows = torch.tensor([20, 13, 7]), torch.tensor([3, 1, 2]), torch.arange(3)
    window = torch.randint(0, 64, (3, 3))
    dyn = caches[0].meta(starts, lengths, rows, keep_states=True)
    h_dyn = m.model(torch.where(dyn.valid, window, 0), dyn, caches[0].target)
    pad_rows = torch.tensor([0, 1, 2, caches[1].pad_row])
    st = caches[1].static_meta(torch.cat([starts, torch.zeros(1, dtype=torch.long)]),
                               torch.cat([lengths, torch.zeros(1, dtype=torch.long)]), pad_rows,
                               num_tokens=5, num_blocks=4, keep_states=True)
    assert st.kv_len is None and st.positions.shape == (4, 5)
    assert (st.slot_mapping[~st.valid] == caches[1].pad_slot).all()
    grid = torch.zeros(4, 5, dtype=torch.long)
    grid[:3, :3] = window
    h_st = m.model(torch.where(st.valid, grid, 0), st, caches[1].target)
    torch.testing.assert_close(h_st[:3, :3][dyn.valid], h_dyn[dyn.valid], rtol=0, atol=1e-12)
    for a, b in zip(caches[0].kv_caches, caches[1].kv_caches):
        torch.testing.assert_close(a.k[: a.k.shape[0] - 1], b.k[: b.k.shape[0] - 1], rtol=0, atol=1e-12)
    bi, ti = dyn.valid.nonzero(as_tuple=True)          # the state after every real window token
    for a, b in zip(caches[0].recurrent, caches[1].recurrent):
        torch.testing.assert_close(a.pending_window.state_at(a.ssm[bi], bi, ti),
                                   b.pending_window.state_at(b.ssm[bi], bi, ti), rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec,k", [(None, None), pytest.param("mtp1", 3, marks=pytest.mark.slow),
                                    ("mtp8", 4)])
def test_compiled_decode_equals_eager_and_never_recompiles(trained_tiny, spec, k):
    """Identical greedy tokens and per-round acceptance; one graph per compiled function, made at
    warm-up; then 20+ steps with batches of 1..4 (and block buckets that grow) trace nothing new."""
    torch._dynamo.reset()
    ref = _llm(trained_tiny, spec, k)
    eager, eager_one = _generate(ref), _generate(ref, PROMPTS[:1], max_tokens=12)
    llm = _llm(trained_tiny, spec, k, compile_backend="eager")
    stats = warm_up(llm.engine)
    # verification, then for a speculator the draft loop and the Gated DeltaNet window commit
    assert stats["num_graphs"] == (1 if spec is None else 3) and stats["compile_s"] > 0
    steps = llm.engine.num_steps
    with torch._dynamo.config.patch(error_on_recompile=True):
        _same(_generate(llm), eager)
        _same(_generate(llm, PROMPTS[:1], max_tokens=12), eager_one)
    assert llm.engine.num_steps - steps >= 20
    assert llm.engine.compiled.num_graphs == stats["num_graphs"]


def test_a_whole_compiled_graph_decodes_gated_deltanet_in_place(trained_tiny, monkeypatch):
    """engine.compile_regions=false: the plain decode graph calls the in-place mtpx::gdn_decode_ on
    each layer's state rows (index_copy_ into a layer's view of the stacked state is scattered
    back into the whole stack under compile: 6x the step's floor at batch 64) and gives eager's
    tokens; a region graph calls the functional mtpx::gdn_decode."""
    from mtpx.models import gdn_kernel
    if not gdn_kernel.available():
        pytest.skip("the CPU kernels are not built")
    calls = []
    decode = gdn_kernel._gdn_decode

    def counted(*args, in_place):
        calls.append(in_place)
        return decode(*args, in_place=in_place)

    import copy
    model = copy.deepcopy(trained_tiny).float()                  # the kernel's dtype
    monkeypatch.setattr(gdn_kernel, "_gdn_decode", counted)
    torch._dynamo.reset()
    eager = _generate(_llm(model, None, None), max_tokens=12)
    assert calls and set(calls) == {True}
    for regions in (False, True):
        calls.clear()
        _same(_generate(_llm(model, None, None, compile_backend="aot_eager", compile_regions=regions),
                        max_tokens=12), eager)
        assert calls and set(calls) == {not regions}


@pytest.mark.slow      # 19 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
def test_callers_grad_mode_does_not_recompile(trained_tiny):
    """generate() under inference_mode, no_grad or neither after warm-up: the client loop and the
    engine step always run under inference_mode, so the compiled step sees the same tensors and
    never recompiles."""
    torch._dynamo.reset()
    ref = _generate(_llm(trained_tiny, "mtp8", 2), PROMPTS[:3], max_tokens=10)
    llm = _llm(trained_tiny, "mtp8", 2, compile_backend="eager")
    warm_up(llm.engine)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for mode in (torch.inference_mode, torch.no_grad, torch.enable_grad):
            with mode():
                _same(_generate(llm, PROMPTS[:3], max_tokens=10), ref)


@pytest.mark.slow      # 23 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
def test_warmup_fits_a_small_pool_and_says_when_it_cannot(trained_tiny, capsys):
    """The warm-up's dummy requests are sized to the KV pool; with a pool too small for any
    request with k drafts it says so (the first decode step then compiles)."""
    torch._dynamo.reset()
    llm = _llm(trained_tiny, "mtp8", 4, compile_backend="eager", block_size=16, num_blocks=2)
    assert warm_up(llm.engine)["num_graphs"] == 3
    llm = _llm(trained_tiny, "mtp8", 4, compile_backend="eager", block_size=4, num_blocks=5)
    warm_up(llm.engine)
    assert "warm-up could not decode" in capsys.readouterr().err


@pytest.mark.slow      # 21 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
def test_compiled_with_prefix_caching_and_invariants(trained_tiny):
    """Prefix caching on a hybrid model (boundary states committed from the static window) with
    the KV-write guard on: identical to eager, no write into a published or free block."""
    torch._dynamo.reset()
    prompts = [PROMPTS[2] + [1, 2, 3] * i for i in range(4)] * 2
    eager = _generate(_llm(trained_tiny, "mtp8", 3, enable_prefix_caching=True, block_size=4,
                           check_invariants=True), prompts)
    compiled = _generate(_llm(trained_tiny, "mtp8", 3, compile_backend="eager",
                              enable_prefix_caching=True, block_size=4, check_invariants=True), prompts)
    _same(compiled, eager)
    assert sum(o.num_cached_tokens for o in compiled) > 0


@pytest.mark.parametrize("draft_sample_method",
                         [pytest.param("greedy", marks=pytest.mark.slow), "probabilistic"])
def test_compiled_sampling_matches_eager(trained_tiny, draft_sample_method):
    """temperature > 0 with seeds: verification runs outside the graph, so the outputs are the
    same as eager's; probabilistic drafts take the eager draft path for those steps."""
    torch._dynamo.reset()
    kw = dict(draft_sample_method=draft_sample_method)
    eager = _generate(_llm(trained_tiny, "mtp1", 2, **kw), temperature=0.8, seed=3)
    compiled = _generate(_llm(trained_tiny, "mtp1", 2, compile_backend="eager", **kw),
                         temperature=0.8, seed=3)
    _same(compiled, eager)


@pytest.mark.slow      # about 35 s on 2 cores; the default suite's time (README.md, the two commands)
def test_compiled_moe_runs_experts_between_graphs():
    """A MoE target: the routed experts run eager between graphs; the tokens are unchanged."""
    torch._dynamo.reset()
    cfg = tiny_config(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32, num_nextn_predict_layers=2)
    model = peaked_model(cfg, seed=1)
    eager = _generate(_llm(model, "mtp8", 2), PROMPTS[:4], max_tokens=12)
    compiled = _generate(_llm(model, "mtp8", 2, compile_backend="eager"), PROMPTS[:4], max_tokens=12)
    _same(compiled, eager)


@pytest.mark.slow      # 98 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
def test_each_engine_compiles_its_own_graphs():
    """An engine never reuses another engine's graphs: after a MoE engine (whose draft loop is
    split at its graph breaks), a dense engine still compiles its three whole graphs."""
    torch._dynamo.reset()
    kw = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=32, num_nextn_predict_layers=2)
    moe = _llm(peaked_model(tiny_config(**kw), seed=1), "mtp8", 2, compile_backend="eager")
    assert moe.compile_stats["num_graphs"] > 2
    dense = _llm(peaked_model(tiny_config(num_nextn_predict_layers=2), seed=1), "mtp8", 2,
                 compile_backend="eager")
    assert dense.compile_stats["num_graphs"] == 3     # verify, window commit, draft loop


@pytest.mark.slow
@pytest.mark.parametrize("spec,k", [("mtp1", 3), ("mtp8", 4)])
def test_inductor_decode_equals_eager(trained_tiny, spec, k):
    """Inductor (C++ kernels on the CPU): greedy tokens are identical, also for a request alone
    (a batch of one runs unpadded in the batch-2 graphs), and the top-2 logit gaps of every
    emitted token agree within 1e-9 (float64); no recompilation after warm-up. Then, on one
    cache state, the compiled verification logits equal the eager forward's within 1e-9 and the
    compiled draft loop drafts the same tokens as the eager one."""
    torch._dynamo.reset()
    ref = _llm(trained_tiny, spec, k)
    eager, eager_one = _generate(ref), _generate(ref, PROMPTS[:1], max_tokens=12)
    llm = _llm(trained_tiny, spec, k, compile_backend="inductor")
    stats = llm.compile_stats
    # verify, commit, draft loop; the warm-up's request alone runs in the batch-2 graphs (the
    # multi-module draft graph once guarded on B >= 2 and compiled a batch-1 copy)
    assert stats["num_graphs"] == 3
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = _generate(llm)
        _same(compiled, eager)
        _same(_generate(llm, PROMPTS[:1], max_tokens=12), eager_one)   # a batch of one, unpadded
        for a, b in zip(compiled, eager):
            assert a.logit_gaps == pytest.approx(b.logit_gaps, abs=1e-9)
    # the finished requests' KV is still in the cache: verify windows of k + 1 tokens at
    # positions 10.. of rows 0..2 (their tokens buffer holds their last sequences)
    with torch._dynamo.config.patch(error_on_recompile=True), torch.inference_mode():
        engine, cache, model = llm.engine, llm.engine.cache, llm.model
        rows, n = torch.tensor([0, 1, 2]), torch.tensor([10, 12, 9])
        lengths = torch.tensor([k + 1, 1, 2])
        st = cache.static_meta(torch.cat([n, n.new_zeros(1)]), torch.cat([lengths, lengths.new_zeros(1)]),
                               torch.tensor([0, 1, 2, cache.pad_row]), k + 1, 4, keep_states=True)
        _, h_c, logits_c = engine.compiled.verify(st)
        dyn = cache.meta(n, lengths, rows, keep_states=True)
        ids = torch.where(dyn.valid, cache.tokens[rows[:, None], dyn.positions], 0)
        logits_e = model.lm_head(model.model(ids, dyn, cache.target))
        torch.testing.assert_close(logits_c[:3, :k + 1][dyn.valid], logits_e[dyn.valid], rtol=0, atol=1e-9)
        spec_ = engine.speculator
        num_tokens = torch.cat([n + lengths, torch.ones(1, dtype=torch.long)])
        live = torch.tensor([True, True, True, False])
        drafts = []
        window = [b.clone() for b in getattr(getattr(spec_, "window", None), "buf", [])]
        target_end = torch.where(live, num_tokens - 1, 0)
        for compiled in (True, False):
            spec_.computed[:3] = n if spec_.computed.dim() == 1 else n[:, None]   # computed up to n
            for buf, saved in zip(getattr(getattr(spec_, "window", None), "buf", []), window):
                buf.copy_(saved)                                  # both loops read the same window
            batch = DraftBatch(st.rows, num_tokens, target_end, live, torch.where(live, k, 0),
                               st.positions[:, 0], h_c, k, k, k + 1, st.block_table)           # as the engine
            d = engine.compiled.draft(batch) if compiled else spec_.propose(cache, batch)
            drafts.append(d.tokens[:3])
        assert torch.equal(drafts[0], drafts[1])


@pytest.mark.slow      # about 30 s: Dynamo traces four graphs per engine
@pytest.mark.parametrize("spec,k", [("mtp1", 3), ("mtp8", 4)])
def test_compiled_auto_k_pads_windows_and_needs_few_graphs(trained_tiny, spec, k):
    """Compiled with a k that changes every step (num_speculative_tokens=auto forced through a
    schedule with stretches of k = 0): tokens equal eager's; windows of 0 < k' < k are padded to
    k + 1 and every draft round has k + 1 columns (a 1-token window's catch-up padded, a longer
    catch-up split into two rounds), so 2 verification graphs (1 and k + 1 tokens), 1 commit and
    1 draft-loop graph are compiled, not one per k (before: 3 draft-loop graphs, 1, k + 1 and 2k
    columns)."""
    from mtpx.auto_k.policy import AutoDraftLength
    torch._dynamo.reset()
    schedule = [k, k, 0, 0, 0, 1, k, 0, 2, 2, 0, 0, k, 1, 0] * 2
    outs = []
    for backend in (None, "eager"):
        llm = _llm(trained_tiny, spec, k, compile_backend=backend)
        policy = AutoDraftLength(k)
        llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
        step = iter(schedule)
        policy.forced = next(step)

        def on_step(engine, policy=policy, step=step):
            policy.forced = next(step, k)

        ps = [SamplingParams(max_tokens=24 - i % 5, ignore_eos=True) for i in range(3)]
        outs.append(llm.generate(PROMPTS[:3], ps, on_step=on_step))
        assert set(policy.histogram) >= {0, 1, k}
    _same(*outs)
    assert llm.engine.compiled.num_graphs == 4


@pytest.mark.slow      # about 30 s: Dynamo traces a graph per depth in use
def test_compiled_per_request_depths_equal_eager(trained_tiny):
    """Compiled (Dynamo, eager backend) with requests of depths 0, 2 and 4 that fall while they run
    (automatic k's per-request depth, scripted): tokens equal eager's."""
    from tests.test_auto_k import ScriptedDepths
    torch._dynamo.reset()
    outs = []
    for backend in (None, "eager"):
        llm = _llm(trained_tiny, "mtp8", 4, compile_backend=backend)
        policy = ScriptedDepths(4, [4, 2, 0, 4, 3, 1], lower_seed=1)
        llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
        llm.engine.scheduler.depth_per_request = True
        policy.forced = None
        ps = [SamplingParams(max_tokens=24 - i % 5, ignore_eos=True) for i in range(3)]
        outs.append(llm.generate(PROMPTS[:3], ps))
    _same(*outs)


@pytest.mark.slow      # 33 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
def test_window_width_stays_static(trained_tiny):
    """A forward graph is compiled per window width, the width a constant: the graph of a 1-token
    forward after windows of k + 1 (automatic k's k = 0 steps) has symbolic sizes in the batch and
    block-table dimensions only, as the first graph has (Dynamo's automatic dynamic shapes would
    make the width symbolic on the first width change)."""
    from mtpx.engine.compiled import _own_code, verify_forward
    torch._dynamo.reset()
    llm = _llm(trained_tiny, "mtp8", 4, compile_backend="eager")
    cache, compiled = llm.engine.cache, llm.engine.compiled
    num_symbolic = []

    def backend(gm, example_inputs):                      # counts each graph's symbolic dims
        num_symbolic.append(sum(isinstance(d, torch.SymInt) for n in gm.graph.nodes if n.op == "placeholder"
                                for v in [n.meta.get("example_value")] if isinstance(v, torch.Tensor)
                                for d in v.shape))
        return gm.forward

    compiled._verify = torch.compile(_own_code(verify_forward), backend=backend)
    with torch.inference_mode():                          # as the model runner calls it
        rows, starts = torch.tensor([0, 1]), torch.tensor([4, 6])
        for width in (5, 1, 5, 1):
            meta = cache.static_meta(starts, torch.tensor([width, width]), rows, width, 2,
                                     keep_states=width == 5)
            compiled.verify(meta)
            cache.clear_pending()
    assert len(num_symbolic) == 2 and num_symbolic[0] > 0
    assert num_symbolic[1] == num_symbolic[0]


def _subgraph_calls(compiled, attribute: str):
    """Recompile compiled.<attribute> with a backend that records, per Dynamo graph, the
    invoke_subgraph calls (the compiled layer regions) and the distinct subgraphs they call."""
    from mtpx.engine.compiled import _own_code, plan_and_draft, verify_forward
    seen = []

    def backend(gm, example_inputs):
        calls = [n for n in gm.graph.nodes if n.op == "call_function"
                 and n.target is torch.ops.higher_order.invoke_subgraph]
        seen.append((len(calls), len({n.args[0].target for n in calls})))
        return gm.forward

    fn = {"_verify": verify_forward, "_draft": plan_and_draft}[attribute]
    setattr(compiled, attribute, torch.compile(_own_code(fn), backend=backend))
    return seen


@pytest.mark.slow      # 33 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
@pytest.mark.parametrize("regions", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_layer_regions_are_traced_once_per_layer_type(trained_tiny, regions):
    """engine.compile_regions: the verification graph calls one compiled region per target layer,
    and the tiny hybrid's 4 layers are 2 distinct regions (Gated DeltaNet, attention); the draft
    loop's 4 MTP modules share 1. Off: no region, every layer inlined in one graph. The tokens
    are the same either way, and equal eager's."""
    torch._dynamo.reset()
    ref = _generate(_llm(trained_tiny, "mtp8", 4), PROMPTS[:3], max_tokens=12)
    llm = _llm(trained_tiny, "mtp8", 4, compile_backend="eager", compile_regions=regions)
    compiled = llm.engine.compiled
    verify, draft = _subgraph_calls(compiled, "_verify"), _subgraph_calls(compiled, "_draft")
    _same(_generate(llm, PROMPTS[:3], max_tokens=12), ref)
    layers = trained_tiny.cfg.num_hidden_layers
    assert verify and set(verify) == ({(layers, 2)} if regions else {(0, 0)})
    assert draft and set(draft) == ({(4, 1)} if regions else {(0, 0)})
    assert llm.engine.compile_stats()["regions"] is regions


@pytest.mark.slow      # 25 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
@pytest.mark.parametrize("depths,graphs", [(None, 7), pytest.param([0, 1, 2, 4], 10, marks=pytest.mark.slow)])
def test_compiled_auto_k_across_depth_changes_never_recompiles_after_warmup(trained_tiny, depths, graphs):
    """num_speculative_tokens=auto, compiled (regions): the warm-up builds the graphs of every
    depth bucket (engine.compile_depths; default 0, 2 and k = 4: verify 1, 3 and 5 tokens, commit 2,
    draft loop 2; [0, 1, 2, 4]: verify 4, commit 3, draft loop 3), so requests whose depths change
    while they run (scripted) decode with error_on_recompile; tokens equal eager's."""
    from tests.test_auto_k import ScriptedDepths
    torch._dynamo.reset()
    outs = []
    for backend in (None, "eager"):
        llm = _llm(trained_tiny, "mtp8", 4, compile_backend=backend, compile_depths=depths)
        llm.engine.scheduler.depth_per_request = True
        if backend is not None:
            stats = warm_up(llm.engine)
            assert stats["num_graphs"] == graphs
        policy = ScriptedDepths(4, [4, 2, 0, 4, 3, 1], lower_seed=1)
        llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
        policy.forced = None
        ps = [SamplingParams(max_tokens=24 - i % 5, ignore_eos=True) for i in range(3)]
        with torch._dynamo.config.patch(error_on_recompile=backend is not None):
            outs.append(llm.generate(PROMPTS[:3], ps))
    _same(*outs)


@pytest.mark.slow      # Dynamo traces the depth buckets' graphs (about 25 s on 2 cores)
def test_warmup_leaves_automatic_k_nothing_learned_from_its_dummy_requests(trained_tiny):
    """The warm-up's dummy requests (a repeated token pattern) are verified through the policy:
    automatic k must forget their acceptance, or a compiled engine decides its first real
    requests on it (the demo's compiled concurrency-4 run started with 78 verified drafts of
    the pattern and ran k = 8 in 98% of its steps where k = 4 was 15% faster). The step costs
    stay."""
    from mtpx.auto_k.policy import AutoDraftLength
    torch._dynamo.reset()
    llm = _llm(trained_tiny, "mtp8", 4, compile_backend="eager")
    costs = {(k, b): 10.0 + k for k in range(5) for b in (1, 4)}
    policy = AutoDraftLength(4, costs)
    llm.engine.draft_length = llm.engine.scheduler.draft_length = policy
    llm.engine.scheduler.depth_per_request = True
    warm_up(llm.engine)
    assert policy.num_observed == [0] * 4 and policy.k == 4 and not policy.histogram
    assert policy.step_costs is not None and policy._steps == 0


def test_depth_buckets():
    from mtpx.engine.compiled import depth_bucket
    from mtpx.engine.decode_step import depth_buckets
    assert [depth_bucket(d, 8) for d in range(9)] == [0] + [4] * 4 + [8] * 4   # default: 0, k // 2 and k
    assert [depth_bucket(d, 3) for d in range(4)] == [0, 3, 3, 3]              # below k = 4: 0 and k
    assert (depth_buckets(8) == [0, 4, 8] and depth_buckets(8, [2, 20]) == [0, 2, 8]
            and depth_buckets(3) == [0, 3])
    powers = [0, 1, 2, 4, 8]
    assert [depth_bucket(d, 8, powers) for d in range(9)] == [0, 1, 2, 4, 4, 8, 8, 8, 8]
    assert [depth_bucket(d, 3, powers) for d in range(4)] == [0, 1, 2, 3]
    assert [depth_bucket(d, 6, powers) for d in range(7)] == [0, 1, 2, 4, 4, 6, 6]
    assert [depth_bucket(d, 8, [2, 20]) for d in range(9)] == [0, 2, 2] + [8] * 6


def test_compile_default_is_decided_by_mode(monkeypatch):
    """engine.compile=null (EngineConfig.compile): serve and bench compile, eval and distill from
    COMPILE_MIN_TOKENS output tokens (the whole data set counts as enough), the API runs eager;
    true / false win; MTPX_COMPILE=0/1 overrides null only."""
    from mtpx.engine.config import COMPILE_MIN_TOKENS, EngineConfig, resolve_compile
    monkeypatch.delenv("MTPX_COMPILE", raising=False)
    assert EngineConfig().compile is None
    assert resolve_compile(None, "serve") and resolve_compile(None, "bench")
    assert resolve_compile(None, "eval", 64 * 128) and resolve_compile(None, "eval", None)
    assert not resolve_compile(None, "eval", COMPILE_MIN_TOKENS - 1)
    assert resolve_compile(None, "distill", COMPILE_MIN_TOKENS)
    assert not resolve_compile(None, "api")
    assert not resolve_compile(False, "serve") and resolve_compile(True, "api")
    monkeypatch.setenv("MTPX_COMPILE", "0")
    assert not resolve_compile(None, "serve") and resolve_compile(True, "eval", 1)
    with pytest.raises(ValueError, match="engine.compile='yes'"):
        EngineConfig(compile="yes")


def test_threads_chosen_from_the_loaded_model_before_compiling(trained_tiny):
    """LLM(threads=callable): called with the loaded model before the warm-up compiles (Dynamo
    guards on the thread count: setting it afterwards, as eval's measured choice did, compiled
    every graph again); its result is kept as thread_choice."""
    before = torch.get_num_threads()
    seen = []

    def choose(model):
        seen.append((model is trained_tiny, torch._dynamo.utils.counters["stats"]["unique_graphs"]))
        torch.set_num_threads(1)
        return "one"

    try:
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        llm = _llm(trained_tiny, None, None, compile_backend="eager", threads=choose)
        assert llm.thread_choice == "one" and seen == [(True, graphs)]
        assert llm.compile_stats["num_graphs"] == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow      # 92 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
@pytest.mark.parametrize("spec,k", [(None, None),
                                    pytest.param("mtp8", 3, marks=pytest.mark.slow)])   # mtp8: 52 s
def test_compiled_graphs_are_saved_and_a_later_engine_loads_them(trained_tiny, spec, k, tmp_path,
                                                                 monkeypatch):
    """engine.compile_cache (mtpx/engine/precompile.py): the first engine compiles every graph
    and saves it under $MTPX_CACHE_DIR/precompiled; a second engine of the same settings (Dynamo
    reset, as in a new process) loads every one of them, compiles none, and both give eager's
    tokens. aot_eager: the same save and load path as Inductor without generating code (without
    layer regions, which torch cannot run loaded under aot_eager; the slow Inductor test loads
    them)."""
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path))
    eager = _generate(_llm(trained_tiny, spec, k))
    torch._dynamo.reset()
    first = _llm(trained_tiny, spec, k, compile_backend="aot_eager", compile_regions=False)
    s1 = first.compile_stats
    assert s1["num_graphs"] == (1 if spec is None else 3) and s1["num_loaded"] == 0
    files = sorted((tmp_path / "precompiled").rglob("*.bin"))
    assert len(files) == s1["num_graphs"]
    torch._dynamo.reset()
    second = _llm(trained_tiny, spec, k, compile_backend="aot_eager", compile_regions=False)
    s2 = second.compile_stats
    assert (s2["num_loaded"], s2["num_compiled"]) == (s1["num_graphs"], 0)
    _same(_generate(second), eager)
    _same(_generate(first), eager)
    assert sorted((tmp_path / "precompiled").rglob("*.bin")) == files     # nothing compiled after warm-up
    # the saved graphs read the weights at run time: other weights of the same shapes load the
    # same files and decode as that model does eager
    import copy
    other = copy.deepcopy(trained_tiny)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)
    other_eager = _generate(_llm(other, spec, k))
    assert [o.output_token_ids for o in other_eager] != [o.output_token_ids for o in eager]
    torch._dynamo.reset()
    loaded = _llm(other, spec, k, compile_backend="aot_eager", compile_regions=False)
    assert loaded.compile_stats["num_compiled"] == 0
    _same(_generate(loaded), other_eager)
    # other settings (a larger batch: other buffer shapes) get a folder of their own
    third = _llm(trained_tiny, spec, k, compile_backend="aot_eager", compile_regions=False, max_num_seqs=8)
    assert third.compile_stats["num_loaded"] == 0
    folders = 2
    if spec is not None:     # unpacked verification windows (engine.ragged_batch=false): other inputs
        grid = _llm(trained_tiny, spec, k, compile_backend="aot_eager", compile_regions=False,
                    ragged_batch=False)
        assert grid.compile_stats["num_loaded"] == 0
        folders = 3
    assert len({f.parent for f in (tmp_path / "precompiled").rglob("*.bin")}) == folders


@pytest.mark.slow      # about 26 s on 2 cores: the default suite's time (README.md, the two commands)
def test_every_saved_graph_is_traced_with_the_guard_filter(trained_tiny, tmp_path, monkeypatch):
    """torch.compile pops guard_filter_fn from the options dict it is given: each graph of a
    function gets a copy, so a function's second graph (automatic k's 1-token verification after
    the k + 1 one) is traced with the filter too, and is saved (it once kept guards that cannot
    be serialized, and was compiled twice)."""
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path))
    real, filtered = torch.compile, []

    def spy(fn, **kw):
        filtered.append("guard_filter_fn" in (kw.get("options") or {}))
        return real(fn, **kw)
    monkeypatch.setattr(torch, "compile", spy)
    torch._dynamo.reset()
    llm = _llm(trained_tiny, "mtp8", 4, compile_backend="aot_eager", compile_regions=False)
    cache, compiled = llm.engine.cache, llm.engine.compiled
    with torch.inference_mode():                  # a 1-token window after the warm-up's 5-token one
        meta = cache.static_meta(torch.tensor([4, 6]), torch.tensor([1, 1]), torch.tensor([0, 1]), 1, 2)
        compiled.verify(meta)
    assert len(filtered) == 4 and all(filtered)
    folder = compiled.precompile_dir
    assert sorted(p.name for p in folder.glob("verify*")) == ["verify_1_token_window.0.bin",
                                                              "verify_5_token_window.0.bin"]


@pytest.mark.slow      # 100 s on a 2-core AVX2 EPYC (the default suite took 39 min there)
def test_a_graph_that_cannot_be_saved_falls_back_to_torch_compile(trained_tiny, tmp_path, monkeypatch,
                                                                  capsys):
    """When saving a graph fails, that graph runs through torch.compile for the rest of the run,
    with one line saying so, and the tokens are eager's; a later run goes to torch.compile
    directly."""
    from mtpx.engine import precompile
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path))

    def fail(*args, **kwargs):
        raise torch._dynamo.exc.PackageError("MODULE_MATCH guard cannot be serialized.")
    monkeypatch.setattr(precompile.Precompiled, "_compile", fail)
    eager = _generate(_llm(trained_tiny, "mtp1", 2))
    torch._dynamo.reset()
    llm = _llm(trained_tiny, "mtp1", 2, compile_backend="aot_eager", compile_regions=False)
    err = capsys.readouterr().err
    assert "cannot be saved for later runs (PackageError: MODULE_MATCH guard cannot be serialized.)" in err
    assert llm.compile_stats["num_compiled"] == 3
    _same(_generate(llm), eager)
    # a later run reads the markers and compiles those functions with torch.compile at once
    def must_not_save(*args, **kwargs):
        raise AssertionError("tried to save a graph marked unsavable")
    monkeypatch.setattr(precompile.Precompiled, "_compile", must_not_save)
    torch._dynamo.reset()
    again = _llm(trained_tiny, "mtp1", 2, compile_backend="aot_eager", compile_regions=False)
    assert "cannot be saved" not in capsys.readouterr().err
    assert again.compile_stats["num_compiled"] == 3
    _same(_generate(again), eager)
