"""flash-linear-attention's recurrent Gated DeltaNet kernel against the engine's torch forms, on
the CPU under Triton's interpreter: the engine's shapes (the tiny hybrid's heads; a verification
window of k + 1 tokens over a batch) and its per-position state layout (the state after each
window token, as the engine keeps and selects it: WindowStates.state_at and
recurrent_gated_delta_rule's all_states).

Opt-in: skipped unless `fla` and `triton` import and TRITON_INTERPRET=1 (set before Triton
loads). Nothing here is installed by the test suite or CI. To run it (tried with fla-core 0.6.0
and triton 3.9.0):

    pip install fla-core triton            # in a scratch environment
    TRITON_INTERPRET=1 python -m pytest -q tests/test_fla_interpret.py
"""
import importlib.util
import os

import pytest
import torch

import mtpx.models.gated_delta_rule as gdr
from tests.helpers import tiny_config


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


pytestmark = pytest.mark.skipif(
    not (_importable("fla") and _importable("triton") and os.environ.get("TRITON_INTERPRET") == "1"),
    reason="opt-in: needs fla and triton, run with TRITON_INTERPRET=1 (module doc)")


def _window(B: int, T: int, seed: int = 0):
    """A verification window in the engine's layout: q, k [B, T, H, Dk] (key heads repeated to the
    value heads, as the layer does), v [B, T, H, Dv], g (log decay <= 0, float32) and beta [B, T, H],
    the states before the window [B, H, Dk, Dv] float32; the tiny hybrid's head sizes."""
    cfg = tiny_config()
    H, Dk, Dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = r(B, T, H, Dk), r(B, T, H, Dk), r(B, T, H, Dv)
    g = -torch.rand(B, T, H, generator=gen) * 2
    beta = torch.rand(B, T, H, generator=gen)
    return q, k, v, g, beta, 0.1 * r(B, H, Dk, Dv)


@pytest.mark.parametrize("B,T", [(1, 1), (3, 4), (2, 9)])       # decode; k = 3; k = 8 (mtp8)
def test_fla_recurrent_kernel_matches_the_torch_forms_per_window_position(B, T):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    q, k, v, g, beta, s0 = _window(B, T)
    o, final = gdr._fla_call(fused_recurrent_gated_delta_rule, q, k, v, g, beta, s0)   # mtpx's conventions
    ref_o, ref_final, all_states = gdr.recurrent_gated_delta_rule(q, k, v, g, beta, s0, keep_all_states=True)
    torch.testing.assert_close(o, ref_o, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, ref_final, atol=1e-4, rtol=1e-4)
    win_o, window = gdr.window_gated_delta_rule(q, k, v, g, beta, s0)
    torch.testing.assert_close(o, win_o, atol=1e-4, rtol=1e-4)
    rows = torch.arange(B)
    for t in range(T):      # the state after each window token: what verification accepting t + 1 keeps
        prefix = (x[:, :t + 1] for x in (q, k, v, g, beta))
        _, after_t = gdr._fla_call(fused_recurrent_gated_delta_rule, *prefix, s0)
        torch.testing.assert_close(after_t, all_states[:, t], atol=1e-4, rtol=1e-4)
        kept = window.state_at(s0, rows, torch.full((B,), t, dtype=torch.long))
        torch.testing.assert_close(after_t, kept, atol=1e-4, rtol=1e-4)
