"""The FlashInfer backend (mtpx.attention.flashinfer_backend) on CPU: its planning arithmetic on a
ragged batch, and its plumbing against a fake `flashinfer` module whose wrappers compute attention
naively from the paged cache as FlashInfer documents it (CSR page table, last_page_len, the causal
mask aligned to the end of each request's KV: query i of qo_len L, kv_len K sees keys 0 .. K - L + i).
The real kernels run only in the CUDA test at the end (skipped here)."""
import sys
import types

import pytest
import torch

from mtpx.attention import flashinfer_backend as fb
from mtpx.attention.flashinfer_backend import FlashInferBackend, FlashInferPlan, paged_kv_plan_inputs
from mtpx.attention.torch_backend import TorchBackend
from mtpx.attention.kv_cache import KVCache
from mtpx.attention.meta import ForwardMeta

S = 4  # block size
# request 0: a 5-token prefill chunk at 8..12; 1: a decode at 20; 2: a verification window at 3..5
STARTS, LENGTHS = torch.tensor([8, 20, 3]), torch.tensor([5, 1, 3])
TABLE = torch.tensor([[3, 7, 1, 9, 22, 23],
                      [0, 2, 4, 6, 8, 5],
                      [11, 13, 22, 23, 22, 23]])


def ragged_meta(starts=STARTS, lengths=LENGTHS, table=TABLE) -> ForwardMeta:
    return ForwardMeta.build(starts, lengths, torch.arange(len(starts)), table, S)


def test_plan_inputs_of_a_ragged_batch():
    qo, kv_indptr, kv_indices, last, kv_lens, pack = paged_kv_plan_inputs(ragged_meta())
    assert qo.tolist() == [0, 5, 6, 9]
    assert kv_lens.tolist() == [13, 21, 6]                 # own last position + 1, not the batch max 21
    assert kv_indptr.tolist() == [0, 4, 10, 12]            # ceil(13/4), ceil(21/4), ceil(6/4) pages
    assert kv_indices.tolist() == [3, 7, 1, 9, 0, 2, 4, 6, 8, 5, 11, 13]
    assert last.tolist() == [1, 1, 2]
    assert pack.tolist() == [0, 1, 2, 3, 4, 5, 10, 11, 12]  # T = 5: rows start at 0, 5, 10
    assert all(t.dtype == torch.int32 for t in (qo, kv_indptr, kv_indices, last, kv_lens))


def test_requests_without_tokens_are_left_out_and_full_pages_end_at_page_size():
    meta = ragged_meta(torch.tensor([8, 0, 4]), torch.tensor([4, 0, 1]))
    qo, kv_indptr, kv_indices, last, kv_lens, pack = paged_kv_plan_inputs(meta)
    assert qo.tolist() == [0, 4, 5] and kv_lens.tolist() == [12, 5]
    assert kv_indptr.tolist() == [0, 3, 5] and kv_indices.tolist() == [3, 7, 1, 11, 13]
    assert last.tolist() == [4, 1] and pack.tolist() == [0, 1, 2, 3, 8]


# ---- a fake flashinfer: records plan() calls, run() computes the documented semantics naively ----

class _FakeWrapper:
    log = []

    def __init__(self, workspace, kv_layout="NHD"):
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8
        self.planned = None

    def _record(self, **kw):
        self.planned = kw
        _FakeWrapper.log.append((self.kind, kw))

    def run(self, q, paged_kv_cache):
        p = self.planned
        k_cache, v_cache = paged_kv_cache
        H, D, Hkv = p["num_qo_heads"], p["head_dim"], p["num_kv_heads"]
        assert q.shape[1:] == (H, D) and k_cache.shape[1:] == (p["page_size"], Hkv, D)
        assert q.dtype == p["q_data_type"] and k_cache.dtype == p["kv_data_type"]
        qo_indptr, kv_indptr = p["qo_indptr"].tolist(), p["kv_indptr"].tolist()
        out = torch.empty_like(q)
        for r in range(len(kv_indptr) - 1):
            pages = p["kv_indices"][kv_indptr[r]:kv_indptr[r + 1]].long()
            K = (len(pages) - 1) * p["page_size"] + int(p["last_page_len"][r])
            keys = k_cache[pages].reshape(-1, Hkv, D)[:K].repeat_interleave(H // Hkv, dim=1)
            vals = v_cache[pages].reshape(-1, Hkv, D)[:K].repeat_interleave(H // Hkv, dim=1)
            qr = q[qo_indptr[r]:qo_indptr[r + 1]]
            L = qr.shape[0]
            scores = torch.einsum("ihd,jhd->hij", qr, keys) * (p["sm_scale"] or D ** -0.5)
            if p["causal"]:
                allowed = torch.arange(K)[None, :] <= (K - L + torch.arange(L))[:, None]
                scores = scores.masked_fill(~allowed, float("-inf"))
            out[qo_indptr[r]:qo_indptr[r + 1]] = torch.einsum("hij,jhd->ihd", scores.softmax(-1), vals)
        return out


class _FakePrefill(_FakeWrapper):
    kind = "prefill"

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim, page_size, causal=False, q_data_type=None,
             kv_data_type=None, sm_scale=None):
        self._record(qo_indptr=qo_indptr, kv_indptr=paged_kv_indptr, kv_indices=paged_kv_indices,
                     last_page_len=paged_kv_last_page_len, num_qo_heads=num_qo_heads,
                     num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
                     causal=causal, q_data_type=q_data_type, kv_data_type=kv_data_type, sm_scale=sm_scale)


class _FakeDecode(_FakeWrapper):
    kind = "decode"

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             q_data_type=None, kv_data_type=None, sm_scale=None):
        self._record(qo_indptr=torch.arange(len(indptr), dtype=torch.int32), kv_indptr=indptr,
                     kv_indices=indices, last_page_len=last_page_len, num_qo_heads=num_qo_heads,
                     num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size, causal=False,
                     q_data_type=q_data_type, kv_data_type=kv_data_type, sm_scale=sm_scale)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    mod = types.ModuleType("flashinfer")
    mod.BatchPrefillWithPagedKVCacheWrapper = _FakePrefill
    mod.BatchDecodeWithPagedKVCacheWrapper = _FakeDecode
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    monkeypatch.setattr(fb, "WORKSPACE_BYTES", 1024)
    _FakeWrapper.log = []
    return _FakeWrapper.log


H, HKV, D = 4, 2, 8


def random_inputs(meta, dtype, seed=0, D=D):
    g = torch.Generator().manual_seed(seed)
    B, T = meta.valid.shape
    cache = KVCache(torch.randn(24, S, HKV, D, generator=g).to(dtype),
                    torch.randn(24, S, HKV, D, generator=g).to(dtype))
    q = torch.randn(B, T, H, D, generator=g).to(dtype)
    k = torch.randn(B, T, HKV, D, generator=g).to(dtype)
    v = torch.randn(B, T, HKV, D, generator=g).to(dtype)
    return q, k, v, cache


def clone(cache):
    return KVCache(cache.k.clone(), cache.v.clone())


def compare(meta, dtype, atol, layers=3):
    """FlashInferBackend (fake kernels) vs TorchBackend over `layers` layers of one forward."""
    backend = FlashInferBackend(torch.device("cpu"))
    meta.planned(backend)
    ref_meta = ForwardMeta(meta.positions, meta.valid, meta.rows, meta.kv_len, meta.block_table, S,
                           meta.slot_mapping)
    for layer in range(layers):
        q, k, v, cache = random_inputs(meta, dtype, seed=layer)
        ref_cache = clone(cache)
        out = backend.forward(q, k, v, cache, meta)
        ref = TorchBackend().forward(q, k, v, ref_cache, ref_meta)
        torch.testing.assert_close(cache.k, ref_cache.k, atol=0, rtol=0)
        torch.testing.assert_close(cache.v, ref_cache.v, atol=0, rtol=0)
        torch.testing.assert_close(out[meta.valid], ref[meta.valid], atol=atol, rtol=0)
        assert bool((out[~meta.valid] == 0).all())
    return backend


def test_ragged_batch_matches_the_torch_reference_with_one_plan_per_forward(fake_flashinfer, monkeypatch):
    monkeypatch.setattr(fb, "SUPPORTED_DTYPES", (torch.float32,))   # fp32 for an exact comparison
    meta = ragged_meta()
    backend = compare(meta, torch.float32, atol=1e-5)
    assert isinstance(meta.attn_plan, FlashInferPlan) and not meta.attn_plan.decode
    assert len(fake_flashinfer) == 1                                 # planned once for three layers
    kind, kw = fake_flashinfer[0]
    assert kind == "prefill" and kw["causal"] is True
    assert (kw["num_qo_heads"], kw["num_kv_heads"], kw["head_dim"], kw["page_size"]) == (H, HKV, D, S)
    assert kw["sm_scale"] == D ** -0.5
    assert kw["qo_indptr"].tolist() == [0, 5, 6, 9] and kw["last_page_len"].tolist() == [1, 1, 2]
    # another forward's plan made in between takes the next wrapper of the ring: both plans stay
    other = ragged_meta(torch.tensor([0, 4, 0]), torch.tensor([2, 2, 2])).planned(backend)
    assert other.attn_plan.wrapper_name != meta.attn_plan.wrapper_name
    q, k, v, cache = random_inputs(meta, torch.float32)
    backend.forward(q, k, v, cache, meta)
    assert len(fake_flashinfer) == 1                                 # still the wrapper's current plan
    q2, k2, v2, cache2 = random_inputs(other, torch.float32)
    backend.forward(q2, k2, v2, cache2, other)
    backend.forward(q, k, v, cache, meta)
    assert len(fake_flashinfer) == 2
    # the ring came round: a plan whose wrapper was planned for another is planned again
    for _ in range(fb.RING - 1):
        ragged_meta().planned(backend)
    late = ragged_meta().planned(backend)
    assert late.attn_plan.wrapper_name == other.attn_plan.wrapper_name
    backend.forward(*random_inputs(late, torch.float32), late)
    backend.forward(q2, k2, v2, cache2, other)
    assert len(fake_flashinfer) == 4


def test_with_the_attention_shape_every_plan_is_made_before_any_layer_runs(fake_flashinfer, monkeypatch):
    """An engine step's plans (a verification window, then k draft-module forwards of one token)
    are all FlashInfer-planned at plan() time, before the first layer runs; running them adds no
    plan and matches the torch reference."""
    monkeypatch.setattr(fb, "SUPPORTED_DTYPES", (torch.float32,))
    backend = FlashInferBackend(torch.device("cpu"), attention_shape=(H, HKV, D, torch.float32))
    metas = [ragged_meta()] + [ForwardMeta.build(torch.tensor([12 + i, 20 + i, 3 + i]),
                                                 torch.ones(3, dtype=torch.long), torch.arange(3), TABLE, S)
                               for i in range(4)]
    for m in metas:
        m.planned(backend)
    assert [kind for kind, _ in fake_flashinfer] == ["prefill"] + ["decode"] * 4
    for i, m in enumerate(metas):
        q, k, v, cache = random_inputs(m, torch.float32, seed=i)
        ref_cache = clone(cache)
        out = backend.forward(q, k, v, cache, m)
        ref = TorchBackend().forward(q, k, v, ref_cache, m)
        torch.testing.assert_close(out[m.valid], ref[m.valid], atol=1e-5, rtol=0)
    assert len(fake_flashinfer) == 5
    refuse = FlashInferBackend(torch.device("cpu"), attention_shape=(H, HKV, D, torch.float64))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        ragged_meta().planned(refuse)


def test_bf16_matches_the_torch_reference(fake_flashinfer):
    compare(ragged_meta(), torch.bfloat16, atol=3e-2, layers=1)
    assert [kind for kind, _ in fake_flashinfer] == ["prefill"]
    assert fake_flashinfer[0][1]["q_data_type"] == torch.bfloat16


def test_decode_only_batches_use_the_decode_wrapper(fake_flashinfer, monkeypatch):
    monkeypatch.setattr(fb, "SUPPORTED_DTYPES", (torch.float32,))
    meta = ForwardMeta.build(torch.tensor([12, 20, 3]), torch.ones(3, dtype=torch.long), torch.arange(3),
                             TABLE, S)
    backend = FlashInferBackend(torch.device("cpu"))
    meta.planned(backend)
    assert meta.attn_plan.decode
    q, k, v, cache = random_inputs(meta, torch.float32)
    ref_cache = clone(cache)
    out = backend.forward(q, k, v, cache, meta)
    ref = TorchBackend().forward(q, k, v, ref_cache, meta)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    assert [kind for kind, _ in fake_flashinfer] == ["decode"]
    assert fake_flashinfer[0][1]["kv_indptr"].tolist() == [0, 4, 10, 11]
    assert fake_flashinfer[0][1]["last_page_len"].tolist() == [1, 1, 4]


def test_the_whole_model_through_the_backend_matches_the_reference(fake_flashinfer, monkeypatch):
    from mtpx.cache.model_cache import ModelCache
    from tests.helpers import peaked_model, tiny_config
    monkeypatch.setattr(fb, "SUPPORTED_DTYPES", (torch.float64,))
    m = peaked_model(tiny_config())
    x = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(0))
    ref = m.model(x)
    cache = ModelCache(m, rows=3, max_len=32, num_draft_modules=0, block_size=8).static_block_tables()
    cache.attention_backend = FlashInferBackend(torch.device("cpu"))
    meta = cache.meta(torch.zeros(3, dtype=torch.long), torch.full((3,), 20), torch.arange(3))
    torch.testing.assert_close(m.model(x, meta, cache.target), ref, atol=1e-10, rtol=0)
    assert len(fake_flashinfer) == 1


def test_float32_models_are_refused_with_the_fix(fake_flashinfer):
    meta = ragged_meta()
    backend = FlashInferBackend(torch.device("cpu"))
    meta.planned(backend)
    q, k, v, cache = random_inputs(meta, torch.float32)
    with pytest.raises(ValueError, match="float16 or bfloat16.*model.dtype=bfloat16"):
        backend.forward(q, k, v, cache, meta)


def test_without_flashinfer_the_backend_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)           # import flashinfer -> ImportError
    with pytest.raises(ValueError, match=r"needs the flashinfer package .*pip install -e '.\[gpu\]'"):
        FlashInferBackend(torch.device("cpu"))


def _real_flashinfer() -> bool:
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not torch.cuda.is_available() or not _real_flashinfer(),
                    reason="needs CUDA and the flashinfer package (pip install -e '.[gpu]')")
@pytest.mark.parametrize("decode", [False, True])
def test_real_flashinfer_on_cuda_matches_the_torch_reference(decode):
    from mtpx.attention.backend import get_backend
    dev = torch.device("cuda")
    backend = get_backend("flashinfer", dev)
    assert isinstance(backend, FlashInferBackend)
    lengths = torch.ones(3, dtype=torch.long) if decode else LENGTHS
    starts = torch.tensor([12, 20, 3]) if decode else STARTS
    meta = ForwardMeta.build(starts.to(dev), lengths.to(dev), torch.arange(3, device=dev), TABLE.to(dev), S)
    meta.planned(backend)
    assert meta.attn_plan.decode == decode
    for layer in range(2):
        q, k, v, cache = random_inputs(meta, torch.bfloat16, seed=layer, D=128)  # a kernel head dim
        q, k, v = q.to(dev), k.to(dev), v.to(dev)
        cache = KVCache(cache.k.to(dev), cache.v.to(dev))
        ref_cache = clone(cache)
        out = backend.forward(q, k, v, cache, meta)
        ref = TorchBackend().forward(q, k, v, ref_cache, meta)
        torch.testing.assert_close(cache.k, ref_cache.k, atol=0, rtol=0)
        torch.testing.assert_close(out[meta.valid].float(), ref[meta.valid].float(), atol=3e-2, rtol=0)
