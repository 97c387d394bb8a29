"""The CPU paged-attention kernel (mtpx/attention/cpu_kernel.py) against its reference, the gather +
scaled_dot_product_attention of torch_backend.cached_attention: random layouts, grouped heads,
head dims off the vector width, padding queries; compiled; the fallback without a compiler; and
the engine's tokens with the kernel on and off."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mtpx.attention import cpu_kernel, torch_backend
from mtpx.attention.kv_cache import KVCache
from mtpx.attention.meta import ForwardMeta

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not cpu_kernel.available(), reason="no C compiler: the kernel is not built")


def make_case(seed, B, T, H, Hkv, D, S, max_len, pad):
    g = torch.Generator().manual_seed(seed)
    nb = -(-(max_len + T) // S)
    NB = B * nb + 3
    cache = KVCache(torch.randn(NB, S, Hkv, D, generator=g), torch.randn(NB, S, Hkv, D, generator=g))
    table = torch.randperm(NB, generator=g)[: B * nb].view(B, nb)
    start = torch.randint(0, max_len + 1, (B,), generator=g)
    positions = start[:, None] + torch.arange(T)
    valid = torch.ones(B, T, dtype=torch.bool)
    if pad:   # right padding of random length per request (its positions read 0, as the engine's)
        keep = torch.randint(1, T + 1, (B,), generator=g)
        valid = torch.arange(T)[None, :] < keep[:, None]
        positions = torch.where(valid, positions, 0)
    slots = table.gather(1, positions // S) * S + positions % S
    meta = ForwardMeta(positions=positions, valid=valid, rows=torch.arange(B),
                       kv_len=int(positions.max()) + 1, block_table=table, block_size=S, slot_mapping=slots)
    q = torch.randn(B, T, H, D, generator=g)
    k, v = torch.randn(B, T, Hkv, D, generator=g), torch.randn(B, T, Hkv, D, generator=g)
    return q, k, v, cache, meta


def both(q, k, v, cache, meta):
    """(reference, kernel) outputs of cached_attention on copies of the cache."""
    outs = []
    try:
        for kernel in (False, True):
            torch_backend.use_kernel = kernel
            c = KVCache(cache.k.clone(), cache.v.clone())
            outs.append(torch_backend.cached_attention(q, k, v, c, meta))
    finally:
        torch_backend.use_kernel = True
    return outs


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), B=st.integers(1, 6), T=st.integers(1, 12),
       heads=st.sampled_from([(1, 1), (4, 2), (4, 4), (8, 2), (6, 3)]),
       D=st.sampled_from([8, 20, 32, 64, 128]), S=st.sampled_from([1, 4, 5, 16]), max_len=st.integers(0, 70),
       pad=st.booleans())
def test_kernel_equals_reference(seed, B, T, heads, D, S, max_len, pad):
    H, Hkv = heads
    q, k, v, cache, meta = make_case(seed, B, T, H, Hkv, D, S, max_len, pad)
    ref, out = both(q, k, v, cache, meta)
    assert out.shape == ref.shape == (B, T, H, D)
    torch.testing.assert_close(out[meta.valid], ref[meta.valid], rtol=1e-5, atol=2e-6)


def test_long_windows_keep_sdpa(monkeypatch):
    """A window longer than MAX_WINDOW (a prefill chunk) runs the reference: the kernel is not called."""
    q, k, v, cache, meta = make_case(0, 2, cpu_kernel.MAX_WINDOW + 1, 4, 2, 32, 16, 40, False)
    called = []
    monkeypatch.setattr(cpu_kernel, "_paged_attention", lambda *a: called.append(a))
    torch_backend.cached_attention(q, k, v, cache, meta)
    assert called == []


def test_threads_give_the_same_output(monkeypatch):
    """Work items split over threads write disjoint outputs: 1 and 3 threads agree exactly."""
    q, k, v, cache, meta = make_case(1, 5, 3, 4, 2, 32, 16, 60, True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch_backend.cached_attention(q, k, v, KVCache(cache.k.clone(), cache.v.clone()), meta)
        torch.set_num_threads(3)
        three = torch_backend.cached_attention(q, k, v, KVCache(cache.k.clone(), cache.v.clone()), meta)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)


def test_compiled_graph_calls_the_kernel(monkeypatch):
    """Under torch.compile the kernel is the custom op mtpx::paged_attention: same output as eager."""
    q, k, v, cache, meta = make_case(2, 3, 2, 4, 2, 32, 16, 30, False)

    def attend(q, kc, vc, table, positions, valid):
        return cpu_kernel.paged_attention(q, kc, vc, table, positions, valid)

    eager = attend(q, cache.k, cache.v, meta.block_table, meta.positions, meta.valid)
    compiled = torch.compile(attend, fullgraph=True, dynamic=False)(q, cache.k, cache.v, meta.block_table,
                                                                     meta.positions, meta.valid)
    assert torch.equal(eager, compiled)


def test_no_compiler_falls_back_with_one_warning(monkeypatch, tmp_path):
    from mtpx.kernels import build
    from mtpx.models import gdn_kernel
    for mod, name in ((build, "_lib"), (build, "_failed"), (cpu_kernel, "_fn"), (gdn_kernel, "_fn"),
                      (gdn_kernel, "_window")):
        monkeypatch.setattr(mod, name, None)
    monkeypatch.setenv("MTPX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.warns(UserWarning, match="the CPU kernels are unavailable .*no-such-cc"):
        assert not cpu_kernel.available()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # decided once: no second warning, no second build
        assert not cpu_kernel.available() and not gdn_kernel.available()
    q, k, v, cache, meta = make_case(3, 2, 1, 4, 2, 32, 16, 20, False)
    out = torch_backend.cached_attention(q, k, v, cache, meta)      # the reference runs
    assert out.shape == (2, 1, 4, 32)


def test_engine_tokens_equal_with_and_without_the_kernel(monkeypatch):
    """Greedy mtp8 on the demo checkpoint: the same tokens whichever attention runs."""
    from mtpx import LLM, SamplingParams
    prompts = ["def fibonacci(n):", "The quick brown fox", "import os\nimport sys\n"]
    outs = []
    for kernel in (False, True):
        monkeypatch.setattr(torch_backend, "use_kernel", kernel)
        llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=8,
                  max_num_seqs=4)
        outs.append([o.outputs[0].token_ids
                     for o in llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0.0))])
    assert outs[0] == outs[1]
