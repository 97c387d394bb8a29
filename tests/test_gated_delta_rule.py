"""The chunked, recurrent and verification-window forms of the gated delta rule agree; the rebuilt window
states equal the prefix states."""
import pytest
import torch

from mtpx.models.gated_delta_rule import (chunk_gated_delta_rule, recurrent_gated_delta_rule,
                                          unit_lower_inverse, unit_lower_inverse_small, unit_lower_solve,
                                          window_gated_delta_rule)


def _inputs(B, T, H, Dk, Dv, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)

    q, k, v = r(B, T, H, Dk), r(B, T, H, Dk), r(B, T, H, Dv)
    gate = -torch.rand(B, T, H, generator=g, dtype=dtype) * 2
    beta = torch.rand(B, T, H, generator=g, dtype=dtype)
    s0 = r(B, H, Dk, Dv)
    return q, k, v, gate, beta, s0


@pytest.mark.parametrize("T,chunk", [(1, 64), (15, 8), (63, 16), (100, 64), (130, 32), (100, 48)])
def test_chunk_matches_recurrent(T, chunk):
    q, k, v, g, beta, s0 = _inputs(2, T, 3, 8, 6)
    o_r, s_r, _ = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    o_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=chunk)
    torch.testing.assert_close(o_c, o_r, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s_c, s_r, atol=1e-10, rtol=1e-10)


def test_chunk_gradients_match_recurrent():
    q, k, v, g, beta, s0 = _inputs(1, 37, 2, 8, 4, seed=1)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, s0)]
    grads = []
    for fn in (lambda *a: recurrent_gated_delta_rule(*a)[:2],
               lambda *a: chunk_gated_delta_rule(*a, chunk_size=16)):
        for x in leaves:
            x.grad = None
        o, s = fn(*leaves)
        (o.sin().sum() + s.cos().sum()).backward()
        grads.append([x.grad.clone() for x in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_padding_tokens_leave_state_unchanged():
    q, k, v, g, beta, s0 = _inputs(1, 10, 2, 8, 4)
    g[:, 6:], beta[:, 6:] = 0, 0
    _, s_full, _ = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    _, s_prefix, _ = recurrent_gated_delta_rule(q[:, :6], k[:, :6], v[:, :6], g[:, :6], beta[:, :6], s0)
    _, s_chunk = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=4)
    torch.testing.assert_close(s_full, s_prefix, atol=0, rtol=0)
    torch.testing.assert_close(s_chunk, s_prefix, atol=1e-12, rtol=1e-12)


def test_kept_states_equal_prefix_states():
    q, k, v, g, beta, s0 = _inputs(2, 7, 2, 8, 4)
    _, _, states = recurrent_gated_delta_rule(q, k, v, g, beta, s0, keep_all_states=True)
    for t in range(7):
        _, s_t, _ = recurrent_gated_delta_rule(q[:, :t + 1], k[:, :t + 1], v[:, :t + 1],
                                               g[:, :t + 1], beta[:, :t + 1], s0)
        torch.testing.assert_close(states[:, t], s_t, atol=0, rtol=0)


@pytest.mark.parametrize("T", [1, 2, 3, 5, 9, 16, 17])
def test_window_matches_recurrent_and_rebuilds_every_state(T):
    """The verification-window form: outputs equal the recurrent form's, and the state it
    rebuilds after any token (any batch row, in any order, with repeats; and in place, as the
    eager commit does) equals the recurrent state after exactly that prefix."""
    q, k, v, g, beta, s0 = _inputs(3, T, 2, 8, 4, seed=T)
    o_r, _, states = recurrent_gated_delta_rule(q, k, v, g, beta, s0, keep_all_states=True)
    o_w, window = window_gated_delta_rule(q, k, v, g, beta, s0)
    torch.testing.assert_close(o_w, o_r, atol=1e-10, rtol=1e-10)
    bi = torch.tensor([2, 0, 1, 0, 2, 1]).repeat(T)
    ti = torch.arange(T).repeat_interleave(6)
    torch.testing.assert_close(window.state_at(s0[bi], bi, ti), states[bi, ti], atol=1e-10, rtol=1e-10)
    state = s0.clone()                          # the eager commit's in-place form, every row at once
    t = torch.tensor([T - 1, 0, T // 2])
    window.advance_(state, t)
    torch.testing.assert_close(state, states[torch.arange(3), t], atol=1e-10, rtol=1e-10)


def test_window_padding_and_small_inverse():
    """Padding tokens (g = beta = 0) after the real ones leave the rebuilt state of the last real
    token alone; the log-depth inverse equals the block-doubling one."""
    q, k, v, g, beta, s0 = _inputs(1, 9, 2, 8, 4, seed=3)
    g[:, 4:], beta[:, 4:] = 0, 0
    _, s_prefix, _ = recurrent_gated_delta_rule(q[:, :4], k[:, :4], v[:, :4], g[:, :4], beta[:, :4], s0)
    _, window = window_gated_delta_rule(q, k, v, g, beta, s0)
    for t in (3, 8):
        idx = torch.tensor([0]), torch.tensor([t])
        torch.testing.assert_close(window.state_at(s0, *idx), s_prefix, atol=1e-12, rtol=1e-12)
    L = torch.randn(4, 13, 13, dtype=torch.float64).tril(-1) * 0.5
    torch.testing.assert_close(unit_lower_inverse_small(L), unit_lower_inverse(L), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_triangular_solve_equals_the_inverse_times_each_rhs(dtype):
    """unit_lower_solve (LAPACK's solve in float32 / float64, the inverse in bfloat16, which has
    no CPU solve) equals unit_lower_inverse(L) @ x for each x, gradients included; L's diagonal
    and upper part are not read."""
    g = torch.Generator().manual_seed(0)
    L = (torch.randn(2, 3, 64, 64, generator=g, dtype=torch.float64).tril(-1) * 0.1).to(dtype)
    rhs = [torch.randn(2, 3, 64, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
           for d in (8, 16)]
    got = unit_lower_solve(L + torch.triu(torch.ones(64, 64, dtype=dtype)), *rhs)
    W = unit_lower_inverse(L)
    tol = dict(atol=1e-10, rtol=1e-10) if dtype == torch.float64 else dict(atol=2e-2, rtol=2e-2) \
        if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    for x, r in zip(got, rhs):
        torch.testing.assert_close(x, W @ r, **tol)
    grads = torch.autograd.grad(sum(x.float().sum() for x in got), rhs)
    for gr in grads:
        torch.testing.assert_close(gr, (W.transpose(-1, -2) @ torch.ones_like(gr).to(dtype)).to(gr.dtype),
                                   **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,T", [(1, 1), (1, 2), (2, 9), (4, 8), (16, 5), (64, 2), (3, 40), (16, 16)])
def test_causal_conv_forms_equal_the_depthwise_conv(dtype, B, T):
    """Every form causal_conv picks (unfolded sum, fused taps, F.conv1d: by rows and dtype) equals
    F.conv1d in float64 on the same inputs, in inference and with gradients."""
    import torch.nn.functional as F

    from mtpx.models.deltanet import causal_conv
    g = torch.Generator().manual_seed(B * 100 + T)
    C, K = 24, 4
    ext = torch.randn(B, C, K - 1 + T, generator=g).to(dtype)
    weight = torch.randn(C, 1, K, generator=g).to(dtype)
    ref = F.conv1d(ext.double(), weight.double(), groups=C)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    with torch.inference_mode():
        out = causal_conv(ext, weight)
    assert out.shape == (B, C, T) and out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(causal_conv(ext, weight).double(), ref, atol=tol, rtol=tol)
