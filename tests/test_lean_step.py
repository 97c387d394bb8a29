"""The lean eager decode step's fast paths equal the paths they replace exactly: the in-place
one-token delta-rule step, the Gated DeltaNet states of an ascending run of batch slots read and
written as views (forward and commit), the paged-KV gather into reused buffers; non-contiguous
batch slots still take the gather path; batch slots are handed out lowest first; the malloc
settings yield to the environment."""
import pytest
import torch

import mtpx.attention.torch_backend as torch_backend
import mtpx.engine.malloc as malloc
from mtpx.attention.torch_backend import gather_kv
from mtpx.cache.model_cache import ModelCache
from mtpx.cache.state import ascending_run, read_rows, write_rows
from mtpx.models.gated_delta_rule import recurrent_gated_delta_rule, recurrent_step_
from tests.helpers import peaked_model, tiny_config


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_recurrent_step_in_place_equals_the_recurrent_form(dtype):
    g = torch.Generator().manual_seed(0)
    B, H, Dk, Dv = 5, 4, 8, 6
    q, k = (torch.randn(B, 1, H, Dk, generator=g, dtype=dtype),
            torch.randn(B, 1, H, Dk, generator=g, dtype=dtype))
    v = torch.randn(B, 1, H, Dv, generator=g, dtype=dtype)
    gate, beta = -torch.rand(B, 1, H, generator=g, dtype=dtype), torch.rand(B, 1, H, generator=g, dtype=dtype)
    s0 = torch.randn(B, H, Dk, Dv, generator=g, dtype=dtype)
    o_ref, s_ref, _ = recurrent_gated_delta_rule(q, k, v, gate, beta, s0)
    state = s0.clone()
    o = recurrent_step_(state, q, k, v, gate, beta)
    assert o.dtype == dtype and o.shape == (B, 1, H, Dv)
    # the rank-1 update is one addcmul_ (a fused multiply-add may round once where mul, add round twice)
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(o, o_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(state, s_ref, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="state is"):
        recurrent_step_(s0.half(), q, k, v, gate, beta)


def test_ascending_runs_are_read_and_written_as_views():
    assert ascending_run([3, 4, 5, 6]) == slice(3, 7)
    for rows in ([3, 5, 6], [4, 3], [2, 2], [7]):
        assert ascending_run(rows) is None
    t = torch.arange(6).float().view(6, 1)
    rows = torch.tensor([1, 2, 3])
    view = read_rows(t, rows, ascending_run([1, 2, 3]))
    assert view.data_ptr() == t[1].data_ptr()                 # a view: written in place
    assert read_rows(t, rows).data_ptr() != t[1].data_ptr()   # no run given: a copy
    write_rows(t, rows, torch.tensor([[10.0], [11.0], [12.0]]), ascending_run([1, 2, 3]))
    assert t[:, 0].tolist() == [0, 10, 11, 12, 4, 5]
    rows = torch.tensor([5, 0])
    assert read_rows(t, rows)[:, 0].tolist() == [5, 0]        # a copy
    write_rows(t, rows, torch.tensor([[-5.0], [-1.0]]))
    assert t[:, 0].tolist() == [-1, 10, 11, 12, 4, -5]


def _decode_run(as_views: bool, dtype):
    """Prefill 3 requests, 3 one-token decode steps and a kept verification window of 4 tokens
    committed at per-row tokens, the rows [1, 2, 3] of a 5-row cache, their states read as views
    (as_views: ForwardMeta.row_run) or gathered; returns the hidden states of every forward and
    the final states (float32: exact compare)."""
    def rows_of(rows):
        return torch.tensor(rows)

    def run(meta):
        meta.row_run = ascending_run([1, 2, 3]) if as_views else None
        return meta

    m = peaked_model(tiny_config(num_hidden_layers=6, full_attention_interval=3)).to(dtype)
    torch.manual_seed(1)
    x = torch.randint(0, 64, (3, 40))
    cache = ModelCache(m, rows=5, max_len=64, num_draft_modules=0, block_size=8).static_block_tables()
    out = []
    lens = torch.tensor([20, 25, 3])
    meta = run(cache.meta(torch.zeros(3, dtype=torch.long), lens, rows_of([1, 2, 3])))
    out.append(m.model(torch.where(meta.valid, x[:, :25], 0), meta, cache.target))
    with torch.inference_mode():
        for _ in range(3):
            meta = run(cache.meta(lens, torch.ones(3, dtype=torch.long), rows_of([1, 2, 3])))
            out.append(m.model(x[torch.arange(3), lens][:, None], meta, cache.target))
            lens = lens + 1
        meta = run(cache.meta(lens, torch.full((3,), 4), rows_of([1, 2, 3]), keep_states=True))
        ids = torch.stack([x[b, lens[b]: lens[b] + 4] for b in range(3)])
        out.append(m.model(ids, meta, cache.target))
        cache.commit_recurrent(torch.tensor([0, 3, 2]))
        lens = lens + torch.tensor([1, 4, 3])
        meta = run(cache.meta(lens, torch.ones(3, dtype=torch.long), rows_of([1, 2, 3])))
        out.append(m.model(x[torch.arange(3), lens][:, None], meta, cache.target))
    g = cache.recurrent_groups[0]
    return out, g.conv.clone(), g.ssm.clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forwards_over_a_run_of_rows_equal_the_gather_path(dtype):
    """Every forward's output and every state equal, bit for bit, with the rows as views
    (ForwardMeta.row_run) and gathered; the rows outside the batch untouched."""
    views = _decode_run(True, dtype)
    gathered = _decode_run(False, dtype)
    for a, b in zip(views[0], gathered[0]):
        assert torch.equal(a, b)
    assert torch.equal(views[1], gathered[1]) and torch.equal(views[2], gathered[2])
    for t in views[1:]:
        assert t[:, [0, 4]].abs().sum() == 0                  # rows 0 and 4 (and pad row 5): zeros
        assert t[:, 1:4].abs().sum() > 0


def test_non_contiguous_rows_still_equal_the_full_forward():
    """Rows [4, 0, 2] (no run) through the same forwards as test_model_cache's reference."""
    m = peaked_model(tiny_config())
    torch.manual_seed(1)
    x = torch.randint(0, 64, (3, 30))
    ref = m.model(x)
    cache = ModelCache(m, rows=5, max_len=64, num_draft_modules=0, block_size=8).static_block_tables()
    rows = torch.tensor([4, 0, 2])
    assert ascending_run([4, 0, 2]) is None
    lens = torch.tensor([20, 25, 1])
    meta = cache.meta(torch.zeros(3, dtype=torch.long), lens, rows)
    m.model(torch.where(meta.valid, x[:, :25], 0), meta, cache.target)
    with torch.inference_mode():
        for _ in range(3):
            meta = cache.meta(lens, torch.ones(3, dtype=torch.long), rows)
            h = m.model(x[torch.arange(3), lens][:, None], meta, cache.target)
            torch.testing.assert_close(h[:, 0], ref[torch.arange(3), lens], atol=1e-12, rtol=0)
            lens = lens + 1


def test_gather_into_reused_buffers_equals_fresh_gather():
    m = peaked_model(tiny_config())
    cache = ModelCache(m, rows=4, max_len=64, num_draft_modules=0, block_size=8).static_block_tables()
    kv = cache.kv_caches[0]
    kv.k.normal_()
    kv.v.normal_()
    table = cache.block_tables[torch.tensor([3, 0, 2])]
    for kv_len in (1, 8, 21, None):
        fresh = gather_kv(kv, table, kv_len)
        reused = gather_kv(kv, table, kv_len, reuse=True)
        assert all(torch.equal(a, b) for a, b in zip(fresh, reused))
        assert reused[0].shape == fresh[0].shape
    # the engine's forward with and without the reused buffers: the same outputs
    outs = []
    for reuse in (False, True):
        torch_backend.reuse_scratch = reuse
        try:
            c = ModelCache(m, rows=4, max_len=64, num_draft_modules=0, block_size=8).static_block_tables()
            meta = c.meta(torch.zeros(3, dtype=torch.long), torch.tensor([9, 17, 4]), torch.tensor([3, 0, 2]))
            with torch.inference_mode():
                outs.append(m.model(torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(0)),
                                    meta, c.target))
        finally:
            torch_backend.reuse_scratch = True
    assert torch.equal(outs[0], outs[1])


def test_rows_are_handed_out_lowest_first():
    m = peaked_model(tiny_config())
    cache = ModelCache(m, rows=4, max_len=16, num_draft_modules=0, block_size=8)
    assert [cache.allocate_row() for _ in range(3)] == [0, 1, 2]
    cache.free_row(2)
    cache.free_row(0)
    assert [cache.allocate_row() for _ in range(3)] == [0, 2, 3]


def test_malloc_settings_yield_to_the_environment(monkeypatch):
    monkeypatch.setattr(malloc, "_applied", False)
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")
    assert malloc.tune_malloc() is False and malloc._applied is False
