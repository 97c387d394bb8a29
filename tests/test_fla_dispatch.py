"""The gated-delta-rule dispatch: torch forms on CPU, flash-linear-attention's kernels (a fake `fla`
here) on CUDA with our conventions, torch forms for per-token / chunk-boundary states, the
engine.gdn_backend switch (the backend argument); plus a real FLA-vs-torch comparison that needs
CUDA and fla."""
import importlib.util
import sys
import types

import pytest
import torch

import mtpx.models.gated_delta_rule as gdr


def _inputs(B=2, T=37, H=3, Dk=8, Dv=6, dtype=torch.float32, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = r(B, T, H, Dk).to(dtype), r(B, T, H, Dk).to(dtype), r(B, T, H, Dv).to(dtype)
    g = (-torch.rand(B, T, H, generator=gen) * 2).float()               # fp32 log decay, as the layer
    beta = torch.rand(B, T, H, generator=gen).to(dtype)                 # sigmoid(b) in the model dtype
    s0 = r(B, H, Dk, Dv).float()
    return [x.to(device) for x in (q, k, v, g, beta, s0)]


class _Spy:
    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.fn(*args, **kwargs)


def _fake_kernel(reference, calls):
    """A stand-in for an fla kernel: checks fla's documented conventions, then computes with our
    reference (which L2-normalises q/k and scales q by Dk^-0.5 itself) on the same tensors."""
    def kernel(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, cu_seqlens=None, **extra):
        calls.append(dict(q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state,
                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                          extra=extra))
        assert use_qk_l2norm_in_kernel and scale == q.shape[-1] ** -0.5
        o, final = reference(q, k, v, g, beta, initial_state)[:2]
        return o.to(q.dtype), (final.float() if output_final_state else None)
    return kernel


@pytest.fixture
def fake_fla(monkeypatch):
    """Installs a fake `fla` package and makes every tensor count as CUDA; returns the call logs."""
    calls = {"chunk": [], "recurrent": []}
    fla, ops, mod = (types.ModuleType(n) for n in ("fla", "fla.ops", "fla.ops.gated_delta_rule"))
    mod.chunk_gated_delta_rule = _fake_kernel(gdr.chunk_gated_delta_rule, calls["chunk"])
    mod.fused_recurrent_gated_delta_rule = _fake_kernel(gdr.recurrent_gated_delta_rule, calls["recurrent"])
    fla.ops, ops.gated_delta_rule = ops, mod
    for name, m in (("fla", fla), ("fla.ops", ops), ("fla.ops.gated_delta_rule", mod)):
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setattr(gdr, "_on_cuda", lambda x: True)
    return calls


@pytest.fixture
def torch_spies(monkeypatch):
    spies = {"chunk": _Spy(gdr.chunk_gated_delta_rule), "recurrent": _Spy(gdr.recurrent_gated_delta_rule)}
    monkeypatch.setattr(gdr, "chunk_gated_delta_rule", spies["chunk"])
    monkeypatch.setattr(gdr, "recurrent_gated_delta_rule", spies["recurrent"])
    return spies


def test_cpu_tensors_run_torch_forms(torch_spies, monkeypatch):
    q, k, v, g, beta, s0 = _inputs()
    o, s, _ = gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0)
    assert len(torch_spies["recurrent"].calls) == 1
    o2, s2 = gdr.gated_delta_rule_chunked(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, s0)
    assert len(torch_spies["chunk"].calls) == 1 and o2.dtype == torch.bfloat16 and s2.dtype == torch.float32


@pytest.mark.parametrize("with_state", [True, False])
def test_recurrent_goes_to_fla_with_our_conventions(fake_fla, torch_spies, with_state):
    q, k, v, g, beta, s0 = _inputs(T=5)
    s0 = s0 if with_state else None
    o, s, states = gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0)
    assert states is None and not torch_spies["recurrent"].calls
    (call,) = fake_fla["recurrent"]
    assert call["q"].shape == (2, 5, 3, 8) and call["v"].shape == (2, 5, 3, 6)  # [B, T, H, D], not head-first
    # raw q/k: the kernel normalises
    assert call["q"] is q or torch.equal(call["q"], q)
    assert torch.equal(call["k"], k)
    assert call["use_qk_l2norm_in_kernel"] is True and call["scale"] == 8 ** -0.5
    assert call["output_final_state"] is True and call["cu_seqlens"] is None and not call["extra"]
    assert call["g"].dtype == torch.float32 and call["beta"].dtype == q.dtype
    assert (call["initial_state"] is None) == (s0 is None)
    if s0 is not None:
        assert call["initial_state"].dtype == torch.float32 and torch.equal(call["initial_state"], s0)
    o_ref, s_ref, _ = gdr.recurrent_gated_delta_rule.fn(q, k, v, g, beta, s0)
    assert o.dtype == v.dtype and s.dtype == torch.float32
    torch.testing.assert_close(o, o_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunked_goes_to_fla_with_our_conventions(fake_fla, dtype):
    q, k, v, g, beta, s0 = _inputs(T=70, dtype=dtype)
    o, s = gdr.gated_delta_rule_chunked(q, k, v, g, beta, s0, chunk_size=16)
    (call,) = fake_fla["chunk"]
    assert call["q"].shape == (2, 70, 3, 8) and torch.equal(call["q"], q) and torch.equal(call["k"], k)
    assert call["use_qk_l2norm_in_kernel"] is True and call["scale"] == 8 ** -0.5
    assert call["output_final_state"] is True and call["cu_seqlens"] is None and not call["extra"]
    assert call["g"].dtype == torch.float32 and call["beta"].dtype == dtype
    assert call["initial_state"].dtype == torch.float32
    # fla chunks by 64 whatever chunk_size says: same result up to float32 rounding, which a
    # 16-bit output can round either way, so compare against our form at fla's chunk size
    o_ref, s_ref = gdr.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=64)
    assert o.dtype == dtype and s.dtype == torch.float32
    torch.testing.assert_close(o.float(), o_ref.float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=1e-6, rtol=0)


def test_state_keeping_calls_never_go_to_fla(fake_fla, torch_spies):
    q, k, v, g, beta, s0 = _inputs(T=32, dtype=torch.bfloat16)
    _, _, states = gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0, keep_all_states=True)
    assert states.shape == (2, 32, 3, 8, 6)
    _, _, chunk_states = gdr.gated_delta_rule_chunked(q, k, v, g, beta, s0, chunk_size=16,
                                                      return_chunk_states=True)
    assert chunk_states.shape == (2, 2, 3, 8, 6)
    assert fake_fla == {"chunk": [], "recurrent": []}
    assert len(torch_spies["recurrent"].calls) == 1 and len(torch_spies["chunk"].calls) == 1


def test_unsupported_inputs_fall_back_to_torch(fake_fla, torch_spies):
    q, k, v, g, beta, s0 = _inputs(T=20)
    gdr.gated_delta_rule_chunked(q, k, v, g, beta, s0)                 # fp32 chunk: torch
    gdr.gated_delta_rule_chunked(*(x.double() for x in (q, k, v, g, beta, s0)))
    gdr.gated_delta_rule_recurrent(*(x.double() for x in (q, k, v, g, beta, s0)))
    leaf = v.clone().requires_grad_()                                   # fused recurrent has no backward
    gdr.gated_delta_rule_recurrent(q, k, leaf, g, beta, s0)[0].sum().backward()
    assert leaf.grad is not None
    assert fake_fla == {"chunk": [], "recurrent": []}
    assert len(torch_spies["chunk"].calls) == 2 and len(torch_spies["recurrent"].calls) == 2


def test_force_torch_switch(fake_fla, torch_spies, monkeypatch):
    q, k, v, g, beta, s0 = _inputs(T=20, dtype=torch.bfloat16)
    gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0, backend="torch")
    gdr.gated_delta_rule_chunked(q, k, v, g, beta, s0, backend="torch")
    assert fake_fla == {"chunk": [], "recurrent": []}
    assert len(torch_spies["recurrent"].calls) == 1 and len(torch_spies["chunk"].calls) == 1
    with pytest.raises(ValueError, match="engine.gdn_backend='bogus'"):
        gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0, backend="bogus")


def test_force_fla_raises_when_unusable(monkeypatch):
    q, k, v, g, beta, s0 = _inputs(T=4)
    with pytest.raises(ValueError, match="CUDA"):                       # CPU tensors
        gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0, backend="fla")
    monkeypatch.setattr(gdr, "_on_cuda", lambda x: True)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)  # import fails
    monkeypatch.setattr(gdr, "_fla_import_error", None)
    with pytest.raises(ValueError, match="flash-linear-attention"):
        gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0, backend="fla")
    # state-keeping calls need no fla at all
    assert gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0, keep_all_states=True,
                                          backend="fla")[2] is not None


def test_missing_fla_falls_back_on_cuda(monkeypatch, torch_spies):
    monkeypatch.setattr(gdr, "_on_cuda", lambda x: True)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)
    monkeypatch.setattr(gdr, "_fla_import_error", None)
    q, k, v, g, beta, s0 = _inputs(T=4, dtype=torch.bfloat16)
    gdr.gated_delta_rule_recurrent(q, k, v, g, beta, s0)
    gdr.gated_delta_rule_chunked(q, k, v, g, beta, s0)
    assert len(torch_spies["recurrent"].calls) == 1 and len(torch_spies["chunk"].calls) == 1


# ------------------------------------------------------------------ real kernels (GPU session)

def _have_fla():
    try:
        return importlib.util.find_spec("fla") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(not (torch.cuda.is_available() and _have_fla()),
                    reason="needs a CUDA device and flash-linear-attention (pip install -e '.[gpu]')")
@pytest.mark.parametrize("kind,dtype,tol", [("recurrent", torch.float32, 1e-4),
                                            ("recurrent", torch.bfloat16, 2e-3),
                                            ("chunk", torch.bfloat16, 2e-3),
                                            ("chunk", torch.float16, 2e-3)])
@pytest.mark.parametrize("T", [1, 7, 130])
def test_fla_matches_torch_on_cuda(kind, dtype, tol, T, monkeypatch):
    fla_ops = importlib.import_module(gdr.FLA_MODULE)
    name = "chunk_gated_delta_rule" if kind == "chunk" else "fused_recurrent_gated_delta_rule"
    spy = _Spy(getattr(fla_ops, name))
    monkeypatch.setattr(fla_ops, name, spy)
    # Qwen3-Next-like head sizes: Dk = Dv = 128
    q, k, v, g, beta, s0 = _inputs(B=2, T=T, H=4, Dk=128, Dv=128, dtype=dtype, device="cuda")
    s0 = s0 * 0.1
    fn = gdr.gated_delta_rule_chunked if kind == "chunk" else gdr.gated_delta_rule_recurrent
    o, s = fn(q, k, v, g, beta, s0, backend="fla")[:2]
    assert len(spy.calls) == 1
    ref = gdr.recurrent_gated_delta_rule(*(x.float() for x in (q, k, v, g, beta, s0)))
    torch.testing.assert_close(o.float(), ref[0], atol=tol, rtol=tol)
    torch.testing.assert_close(s, ref[1], atol=tol, rtol=tol)
