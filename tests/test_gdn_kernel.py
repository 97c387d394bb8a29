"""The CPU Gated DeltaNet decode kernel (mtpx/models/gdn_kernel.py) against the layer's torch ops:
the output and both states after several decode tokens, with padding rows, rows out of order,
the packed layout, and head shapes off the specialised ones; where it must not run; and the
engine's tokens with it on and off."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtpx.attention.meta import ForwardMeta
from mtpx.cache.state import RecurrentState
from mtpx.models import gdn_kernel
from mtpx.models.deltanet import GatedDeltaNet
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not gdn_kernel.available(), reason="no C compiler: the kernel is not built")


def make_layer(nk, nv, dk, dv, K, seed=0):
    cfg = tiny_config(linear_num_key_heads=nk, linear_num_value_heads=nv, linear_key_head_dim=dk,
                      linear_value_head_dim=dv, linear_conv_kernel_dim=K)
    torch.manual_seed(seed)
    layer = GatedDeltaNet(cfg).eval()
    with torch.no_grad():                       # weights away from their initial values
        layer.dt_bias.uniform_(-1, 1)
        layer.norm.weight.uniform_(0.5, 1.5)
    return cfg, layer


def decode_tokens(layer, cfg, kernel: bool, rows, valid, steps=4, packed=False, seed=1):
    """`steps` one-token forwards of B requests at batch slots `rows` (valid [B]: padding False)
    from a random stored state; returns (outputs, conv state, ssm state)."""
    g = torch.Generator().manual_seed(seed)
    B, R = len(rows), max(rows) + 2
    state = RecurrentState.allocate(R, layer.conv_dim, layer.kernel, layer.nv, layer.dk, layer.dv,
                                    torch.float32)
    state.conv.copy_(torch.randn(state.conv.shape, generator=g))
    state.ssm.copy_(torch.randn(state.ssm.shape, generator=g) * 0.3)
    rows_t, valid_t = torch.tensor(rows), torch.tensor(valid)[:, None]
    outs, calls, decode = [], [], gdn_kernel.decode
    gdn_kernel.use_kernel = kernel
    gdn_kernel.decode = lambda *a: calls.append(1) or decode(*a)
    try:
        with torch.inference_mode():
            for step in range(steps):
                meta = ForwardMeta(positions=torch.full((B, 1), 10 + step), valid=valid_t, rows=rows_t,
                                   kv_len=11 + step)
                x = torch.randn(B, 1, cfg.hidden_size, generator=g)
                if packed:
                    meta = meta.pack_valid()
                    x = x[:, 0]
                outs.append(layer(x, state, meta))
    finally:
        gdn_kernel.use_kernel, gdn_kernel.decode = True, decode
    assert len(calls) == (steps if kernel else 0)
    return (torch.stack(outs) if outs else None), state.conv.clone(), state.ssm.clone()


@pytest.mark.parametrize("heads", [(2, 4, 16, 16, 4), (2, 2, 32, 32, 4), (1, 3, 8, 20, 2), (2, 4, 32, 32, 3)])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_kernel_equals_the_torch_ops(heads, layout):
    cfg, layer = make_layer(*heads)
    rows = [5, 0, 3, 2] if layout == "padded" else [1, 4, 0]
    valid = [True, False, True, True] if layout == "padded" else [True, True, True]
    ref = decode_tokens(layer, cfg, False, rows, valid, packed=layout == "packed")
    out = decode_tokens(layer, cfg, True, rows, valid, packed=layout == "packed")
    keep = torch.tensor(valid)
    torch.testing.assert_close(out[0][:, keep], ref[0][:, keep], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out[1], ref[1], rtol=0, atol=0)          # the conv inputs move, exactly
    torch.testing.assert_close(out[2], ref[2], rtol=1e-4, atol=1e-5)
    if not all(valid):                                                   # padding rows keep their state
        pad = rows[valid.index(False)]
        fresh = decode_tokens(layer, cfg, True, rows, valid, steps=0)
        assert torch.equal(out[1][pad], fresh[1][pad]) and torch.equal(out[2][pad], fresh[2][pad])


def test_does_not_run_where_the_torch_forms_must():
    cfg, layer = make_layer(2, 4, 16, 16, 4)
    state = RecurrentState.allocate(4, layer.conv_dim, layer.kernel, layer.nv, layer.dk, layer.dv,
                                    torch.float32)
    qkvz = torch.zeros(2, 1, 8)
    one = ForwardMeta(positions=torch.zeros(2, 1, dtype=torch.long), valid=torch.ones(2, 1, dtype=torch.bool),
                      rows=torch.tensor([0, 1]), kv_len=1)
    with torch.inference_mode():
        assert gdn_kernel.runs(layer, qkvz, state, one)
        window = ForwardMeta(positions=torch.zeros(2, 3, dtype=torch.long),
                             valid=torch.ones(2, 3, dtype=torch.bool), rows=torch.tensor([0, 1]), kv_len=3)
        assert not gdn_kernel.runs(layer, torch.zeros(2, 3, 8), state, window)          # a window
        kept = ForwardMeta(**{**one.__dict__, "keep_states": True})
        assert not gdn_kernel.runs(layer, qkvz, state, kept)                            # verification
        assert not gdn_kernel.runs(layer, qkvz.double(), state, one)                    # float64
        assert not gdn_kernel.runs(layer, qkvz, None, one)                              # no cache
    assert not gdn_kernel.runs(layer, qkvz, state, one)                                 # gradients on


def test_engine_tokens_equal_with_and_without_the_kernel(monkeypatch):
    """Plain and mtp8 greedy decoding on the demo checkpoint: the same tokens either way."""
    from mtpx import LLM, SamplingParams
    prompts = ["def fibonacci(n):", "The quick brown fox", "import os\nimport sys\n", "for i in range(10):"]
    for spec in ({}, dict(spec="mtp8", num_speculative_tokens=8)):
        outs = []
        for kernel in (False, True):
            monkeypatch.setattr(gdn_kernel, "use_kernel", kernel)
            llm = LLM(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=4, **spec)
            res = llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0.0))
            outs.append([o.outputs[0].token_ids for o in res])
        assert outs[0] == outs[1]


@pytest.mark.parametrize("region", [False, True])
def test_compiled_layer_calls_the_op_and_equals_eager(monkeypatch, region):
    """Under torch.compile the kernel is the in-place op mtpx::gdn_decode_, or in a compiled layer
    region (meta.region) the functional mtpx::gdn_decode, whose new state rows are written back as
    the torch forms write them: the same output and states as eager either way."""
    calls, kernel = [], gdn_kernel._gdn_decode
    monkeypatch.setattr(gdn_kernel, "_gdn_decode",
                        lambda *a, **kw: calls.append(kw["in_place"]) or kernel(*a, **kw))
    cfg, layer = make_layer(2, 4, 16, 16, 4)
    g = torch.Generator().manual_seed(3)
    rows, valid = torch.tensor([3, 0, 2]), torch.tensor([[True], [False], [True]])
    x = torch.randn(3, 1, cfg.hidden_size, generator=g)
    results = []
    for compiled in (False, True):
        state = RecurrentState.allocate(5, layer.conv_dim, layer.kernel, layer.nv, layer.dk, layer.dv,
                                        torch.float32)
        state.conv.copy_(torch.randn(state.conv.shape, generator=torch.Generator().manual_seed(4)))
        state.ssm.copy_(torch.randn(state.ssm.shape, generator=torch.Generator().manual_seed(5)))
        meta = ForwardMeta(positions=torch.full((3, 1), 7), valid=valid, rows=rows, kv_len=8, region=region)
        torch._dynamo.reset()
        fn = torch.compile(layer, fullgraph=True, dynamic=False) if compiled else layer
        with torch.inference_mode():
            results.append((fn(x, state, meta), state.conv.clone(), state.ssm.clone()))
    (out_e, conv_e, ssm_e), (out_c, conv_c, ssm_c) = results
    assert calls[0] is True and set(calls[1:]) == {not region}   # eager in place, then the compiled op
    torch.testing.assert_close(out_c[valid[:, 0]], out_e[valid[:, 0]], rtol=1e-5, atol=1e-6)
    assert torch.equal(conv_c, conv_e)
    torch.testing.assert_close(ssm_c, ssm_e, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(3, 5, 4, 16, 16), (2, 9, 3, 8, 20), (4, 1, 2, 32, 32)])
def test_window_equals_the_chunked_window_form(shape):
    """gdn_kernel.window against window_gated_delta_rule: outputs, the kept WindowStates, and the
    state rebuilt after every window token."""
    from mtpx.models.gated_delta_rule import window_gated_delta_rule
    B, T, H, dk, dv = shape
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(B, T, H, dk, generator=g), torch.randn(B, T, H, dk, generator=g)
    v = torch.randn(B, T, H, dv, generator=g)
    gate = -torch.rand(B, T, H, generator=g) * 2
    beta = torch.rand(B, T, H, generator=g)
    beta[0, -1] = 0
    gate[0, -1] = 0                                       # a padding token: the state stays
    S0 = torch.randn(B, H, dk, dv, generator=g) * 0.3
    with torch.inference_mode():
        ref_o, ref_w = window_gated_delta_rule(q, k, v, gate, beta, S0)
        out_o, out_w = gdn_kernel.window(q, k, v, gate, beta, S0)
        for name in ("k", "v_new", "G"):
            torch.testing.assert_close(getattr(out_w, name), getattr(ref_w, name), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out_o, ref_o, rtol=1e-4, atol=1e-5)
        for t in range(T):
            at = torch.full((B,), t)
            torch.testing.assert_close(out_w.state_after(S0, at), ref_w.state_after(S0, at), rtol=1e-4,
                                       atol=1e-5)


@pytest.mark.parametrize("lengths", [(5, 1, 3, 0), (2, 5, 5, 4)])
def test_window_skips_padding_tokens_and_keeps_the_reference_states(lengths):
    """A ragged window (rows of different lengths right-padded to T, valid False with g = beta = 0
    on padding, as the engine's grid): the kernel skips the padding tokens, and its outputs at the
    real tokens, its kept v_new and G at every token and the state after every token (padding ones
    included: the state after the row's last real token) equal the reference's computed on every
    token; its padding outputs, keys and v_new are 0."""
    from mtpx.models.gated_delta_rule import window_gated_delta_rule
    B, T, H, dk, dv = len(lengths), 5, 3, 16, 32
    g = torch.Generator().manual_seed(11)
    valid = torch.arange(T)[None] < torch.tensor(lengths)[:, None]                    # [B, T]
    q, k = torch.randn(B, T, H, dk, generator=g), torch.randn(B, T, H, dk, generator=g)
    v = torch.randn(B, T, H, dv, generator=g)
    gate = -torch.rand(B, T, H, generator=g) * 2 * valid[..., None]
    beta = torch.rand(B, T, H, generator=g) * valid[..., None]
    S0 = torch.randn(B, H, dk, dv, generator=g) * 0.3
    with torch.inference_mode():
        ref_o, ref_w = window_gated_delta_rule(q, k, v, gate, beta, S0)
        out_o, out_w = gdn_kernel.window(q, k, v, gate, beta, S0, valid)
        torch.testing.assert_close(out_o[valid], ref_o[valid], rtol=1e-4, atol=1e-5)
        assert torch.equal(out_o[~valid], torch.zeros_like(out_o[~valid]))
        pad = ~valid[:, None, :].expand(B, H, T)                                          # [B, H, T]
        assert torch.equal(out_w.k[pad], torch.zeros_like(out_w.k[pad]))
        assert torch.equal(out_w.v_new[pad], torch.zeros_like(out_w.v_new[pad]))
        torch.testing.assert_close(out_w.k[~pad], ref_w.k[~pad], rtol=1e-4, atol=1e-5)
        for name in ("v_new", "G"):
            torch.testing.assert_close(getattr(out_w, name), getattr(ref_w, name), rtol=1e-4, atol=1e-5)
        for t in range(T):
            at = torch.full((B,), t)
            torch.testing.assert_close(out_w.state_after(S0, at), ref_w.state_after(S0, at), rtol=1e-4,
                                       atol=1e-5)


def prefill(layer, cfg, kernel: bool, lengths, packed: bool, save: bool, block_size: int = 4, seed=2):
    """One prefill forward of requests of `lengths` tokens at batch slots 3, 0, 5, ... from random
    stored states (rows beyond a request's length are padding), boundary states at block ends
    when `save`; returns (outputs of the real tokens, conv state, ssm state, block ssm, block conv)."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    rows = torch.tensor([3, 0, 5, 1, 4][:B])
    state = RecurrentState.allocate(6, layer.conv_dim, layer.kernel, layer.nv, layer.dk, layer.dv,
                                    torch.float32, num_blocks=64 if save else 0)
    state.conv.copy_(torch.randn(state.conv.shape, generator=g))
    state.ssm.copy_(torch.randn(state.ssm.shape, generator=g) * 0.3)
    valid = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    meta = ForwardMeta(positions=torch.arange(T).expand(B, T).clone(), valid=valid, rows=rows, kv_len=T,
                       block_size=block_size)
    if save:       # every block end of every request
        ends = [(b, t) for b, n in enumerate(lengths) for t in range(block_size - 1, n, block_size)]
        bi, ti = (torch.tensor(x, dtype=torch.long) for x in zip(*ends))
        meta.save_states = (bi, ti, torch.arange(len(ends)))
    x = torch.randn(B, T, cfg.hidden_size, generator=g)
    if packed:
        meta = meta.pack_valid(list(lengths))
        x = x[valid]
    gdn_kernel.use_kernel = kernel
    try:
        with torch.inference_mode():
            out = layer(x, state, meta)
    finally:
        gdn_kernel.use_kernel = True
    out = out if packed else out[valid]
    blocks = (state.block_ssm.clone(), state.block_conv.clone()) if save else (None, None)
    return out, state.conv.clone(), state.ssm.clone(), *blocks


@pytest.mark.parametrize("lengths", [[24], [5], [40, 17, 3], [64, 1, 30, 9]])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("save", [False, True])
def test_prefill_kernel_equals_the_torch_forms(lengths, packed, save, monkeypatch):
    """A prefill on the CPU in float32 runs the recurrence in the C window kernel
    (deltanet._kernel_recurrence): outputs, conv and recurrent states, and the boundary states at
    block ends equal the chunked / recurrent torch forms' within float32 rounding, on the padded
    grid and packed, with padding rows and rows out of order."""
    if packed and max(lengths) <= 16:
        pytest.skip("a packed forward of short requests runs the grid path")
    cfg, layer = make_layer(2, 4, 32, 32, 4)
    calls, window = [], gdn_kernel.window
    monkeypatch.setattr(gdn_kernel, "window", lambda *a: calls.append(1) or window(*a))
    ref = prefill(layer, cfg, False, lengths, packed, save)
    assert not calls
    out = prefill(layer, cfg, True, lengths, packed, save)
    assert calls == [1]
    for a, b in zip(out, ref):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)
