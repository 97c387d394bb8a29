"""Incremental forwards with caches equal the from-scratch forward (prefill, decode, verification
windows with state selection) on a ragged batch in float64."""
import pytest
import torch

from mtpx.cache.model_cache import ModelCache
from tests.helpers import peaked_model, tiny_config


def test_incremental_equals_full_forward():
    m = peaked_model(tiny_config())
    torch.manual_seed(1)
    x = torch.randint(0, 64, (3, 40))
    ref = m.model(x)                                                    # [3, 40, hidden]
    cache = ModelCache(m, rows=5, max_len=64, num_draft_modules=0, block_size=8).static_block_tables()
    rows = torch.tensor([4, 0, 2])
    lens = torch.tensor([20, 25, 1])
    meta = cache.meta(torch.zeros(3, dtype=torch.long), lens, rows)
    h = m.model(torch.where(meta.valid, x[:, :25], 0), meta, cache.target)
    for b in range(3):
        torch.testing.assert_close(h[b, : lens[b]], ref[b, : lens[b]], atol=1e-12, rtol=0)
    for _ in range(3):  # one-token decode steps
        meta = cache.meta(lens, torch.ones(3, dtype=torch.long), rows)
        h = m.model(x[torch.arange(3), lens][:, None], meta, cache.target)
        torch.testing.assert_close(h[:, 0], ref[torch.arange(3), lens], atol=1e-12, rtol=0)
        lens = lens + 1
    # verification windows of different lengths, then keep the state after token `keep[b]`
    win = torch.tensor([4, 3, 5])
    meta = cache.meta(lens, win, rows, keep_states=True)
    ids = torch.stack([x[b, lens[b]: lens[b] + 5] for b in range(3)])
    h = m.model(torch.where(meta.valid, ids, 0), meta, cache.target)
    for b in range(3):
        torch.testing.assert_close(h[b, : win[b]], ref[b, lens[b]: lens[b] + win[b]], atol=1e-12, rtol=0)
    keep = torch.tensor([0, 2, 3])
    cache.commit_recurrent(keep)
    lens = lens + keep + 1
    meta = cache.meta(lens, torch.full((3,), 2), rows)
    ids = torch.stack([x[b, lens[b]: lens[b] + 2] for b in range(3)])
    h = m.model(ids, meta, cache.target)
    for b in range(3):
        torch.testing.assert_close(h[b], ref[b, lens[b]: lens[b] + 2], atol=1e-12, rtol=0)


@pytest.mark.parametrize("how", ["eager", "eager_one_layer_per_pass", "traced"])
def test_grouped_commit_equals_each_layers_state(how, monkeypatch):
    """The commit over the stacked states of every Gated DeltaNet layer (RecurrentStateGroup)
    leaves each layer's rows at that layer's own window state after the kept token (and the conv
    window after it), and other rows untouched: eager in one pass, eager one layer per pass, and
    traced by Dynamo (the reduction form engine.compile runs), float64 within 1e-12."""
    m = peaked_model(tiny_config(num_hidden_layers=6, full_attention_interval=3))
    torch.manual_seed(2)
    cache = ModelCache(m, rows=4, max_len=64, num_draft_modules=0, block_size=8).static_block_tables()
    assert len(cache.recurrent_groups) == 1 and len(cache.recurrent) == 4
    rows = torch.tensor([3, 0, 2])
    x = torch.randint(0, 64, (3, 30))
    meta = cache.meta(torch.zeros(3, dtype=torch.long), torch.tensor([12, 20, 7]), rows)
    m.model(torch.where(meta.valid, x[:, :20], 0), meta, cache.target)
    meta = cache.meta(torch.tensor([12, 20, 7]), torch.tensor([5, 3, 5]), rows, keep_states=True)
    m.model(torch.where(meta.valid, x[:, 20:25], 0), meta, cache.target)
    keep, b = torch.tensor([4, 1, 0]), torch.arange(3)
    want = [(c.pending_conv[b, keep].clone(), c.pending_window.state_at(c.ssm[rows], b, keep))
            for c in cache.recurrent]
    untouched = [(c.conv[1].clone(), c.ssm[1].clone()) for c in cache.recurrent]
    if how == "eager_one_layer_per_pass":
        monkeypatch.setattr(type(cache.recurrent_groups[0]), "slice_bytes", 1)
    if how == "traced":
        torch._dynamo.reset()
        torch.compile(cache.commit_windows, backend="eager", fullgraph=True)(keep)
    else:
        cache.commit_windows(keep)
    for c, (conv, ssm), (conv1, ssm1) in zip(cache.recurrent, want, untouched):
        torch.testing.assert_close(c.conv[rows], conv, rtol=0, atol=0)
        torch.testing.assert_close(c.ssm[rows], ssm, rtol=0, atol=1e-12)
        assert torch.equal(c.conv[1], conv1) and torch.equal(c.ssm[1], ssm1)


def test_a_compiled_keep_writes_the_stacked_window_buffers_in_place():
    """RecurrentStateGroup.keep under torch.compile (a whole graph) goes through the operator
    mtpx::write_window_, which writes the layer's rows of the stacked window buffers in place:
    the same buffers as eager's index_copy_ into the layer's views, every other layer and row
    untouched."""
    from mtpx.cache.state import RecurrentStateGroup, RecurrentStateSpec, WindowStates
    spec = RecurrentStateSpec(conv_dim=6, kernel=4, heads=2, key_dim=3, value_dim=5)
    g = torch.Generator().manual_seed(0)
    B, T, rows = 2, 3, torch.tensor([3, 1])
    window = WindowStates(torch.randn(B, 2, T, 3, generator=g), torch.randn(B, 2, T, 5, generator=g),
                          torch.randn(B, 2, T, generator=g))
    ext = torch.randn(B, 6, 3 + T, generator=g)
    groups = []
    for compiled in (False, True):
        group = RecurrentStateGroup.allocate(3, 5, spec, torch.float32)
        group.reserve_windows(T)
        for w in (group.window_k, group.window_v_new, group.window_G, group.window_ext):
            w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
        keep = torch.compile(group.keep, backend="aot_eager", fullgraph=True) if compiled else group.keep
        keep(1, rows, window, ext)
        groups.append(group)
    eager, compiled = groups
    for name in ("window_k", "window_v_new", "window_G", "window_ext"):
        assert torch.equal(getattr(compiled, name), getattr(eager, name)), name
    k = eager.windows(T)[0]
    assert torch.equal(k[1, rows], window.k) and not torch.equal(k[0, rows], window.k)
