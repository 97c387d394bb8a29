"""The pointwise kernels (mtpx/kernels/rms_norm.c, silu_and_mul.c and qk_norm_rope.c through
mtpx/models/cpu_ops.py): equal to the torch references within float32 rounding, the residual add
exact, rows independent of their batch (what keeps speculative decoding token-identical to plain
decoding), and the references wherever the kernels must not run (gradients, other dtypes)."""
from pathlib import Path

import pytest
import torch

from mtpx.models import cpu_ops
from mtpx.models.norm import RMSNorm

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="no C compiler: the kernel is not built")


def _norm(dim: int, unit_offset: bool, seed: int = 0) -> RMSNorm:
    n = RMSNorm(dim, 1e-6, unit_offset)
    g = torch.Generator().manual_seed(seed)
    n.weight.data = torch.randn(dim, generator=g) * 0.1 + (0.0 if unit_offset else 1.0)
    return n


@pytest.mark.parametrize("unit_offset", [True, False])
@pytest.mark.parametrize("shape", [(64, 128), (3, 5, 128), (64, 4, 32), (7, 100), (1, 8), (2, 3)])
def test_kernel_equals_the_reference_within_float32_rounding(unit_offset, shape):
    n, g = _norm(shape[-1], unit_offset), torch.Generator().manual_seed(1)
    x, r = torch.randn(*shape, generator=g) * 3, torch.randn(*shape, generator=g)
    with torch.inference_mode():
        y, (s, z) = n(x), n.forward_add(x, r)
        ref = n._reference(x)
    assert torch.allclose(y, ref, rtol=2e-6, atol=2e-6)
    assert torch.equal(s, x + r)                                     # the add is exact
    assert torch.allclose(z, n._reference(x + r), rtol=2e-6, atol=2e-6)
    assert y.shape == z.shape == shape and y.is_contiguous()


def test_rows_do_not_depend_on_their_batch_and_strided_input_is_read_right():
    n, g = _norm(128, True), torch.Generator().manual_seed(2)
    x = torch.randn(64, 128, generator=g)
    with torch.inference_mode():
        whole = n(x)
        assert all(torch.equal(whole[i:j], n(x[i:j])) for i, j in [(0, 1), (5, 9), (63, 64), (0, 64)])
        wide = torch.randn(8, 256, generator=g)
        assert torch.equal(n(wide[:, 64:192]), n(wide[:, 64:192].contiguous()))   # a strided view


def test_the_reference_runs_in_training_other_dtypes_and_with_the_switch_off(monkeypatch):
    """Only the engine's inference (torch.inference_mode) takes the kernels: a loss computed with
    or without gradients (training, its no_grad evaluations) is the same torch ops. A residual of
    another dtype than x (bfloat16 autocast: an fp32 stream plus a bf16 mixer output) takes the
    reference too: the kernel reads float32 only."""
    n, x = _norm(32, True), torch.randn(4, 32)
    calls, kernel = [], cpu_ops.rms_norm
    monkeypatch.setattr(cpu_ops, "rms_norm", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    y = n(x)                                                         # gradients on: training
    assert y.grad_fn is not None and torch.equal(y, n._reference(x)) and not calls
    with torch.no_grad():                                            # a training evaluation
        assert torch.equal(n(x), n._reference(x)) and not calls
    with torch.inference_mode():
        s, z = n.forward_add(x, x.bfloat16())
        assert torch.equal(s, x + x.bfloat16()) and not calls
        assert n.double()(x.double()).dtype == torch.float64 and not calls
        n.float()
        monkeypatch.setattr(cpu_ops, "use_kernel", False)
        assert torch.equal(n(x), n._reference(x)) and not calls
        monkeypatch.setattr(cpu_ops, "use_kernel", True)
        n(x)
    assert calls == [1]


@pytest.mark.parametrize("shape", [(64, 1, 512), (3, 7), (1, 70000)])
def test_silu_and_mul_equals_the_reference_within_float32_rounding(shape):
    from mtpx.models.mlp import MLP
    g = torch.Generator().manual_seed(3)
    gate, up = torch.randn(*shape, generator=g) * 4, torch.randn(*shape, generator=g)
    out = cpu_ops.silu_and_mul(gate, up)
    assert (out.shape == shape
            and torch.allclose(out, torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-6))
    assert torch.equal(cpu_ops.silu_and_mul(gate[:1], up[:1]), out[:1])            # rows independent
    mlp = MLP(16, 32)
    x = torch.randn(5, 16, generator=g)
    with torch.no_grad():
        assert torch.equal(mlp(x), mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)))
    with torch.inference_mode():
        fast = mlp(x)
        cpu_ops.use_kernel = False
        try:
            ref = mlp(x)
        finally:
            cpu_ops.use_kernel = True
    assert torch.allclose(fast, ref, rtol=1e-5, atol=1e-6) and mlp(x).grad_fn is not None   # gradients: torch


@pytest.mark.parametrize("use_qk_norm,unit_offset", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("lead,rotary", [((5, 1), 0.25), ((2, 7), 1.0), ((9,), 0.5)])
def test_qk_norm_rope_equals_the_attention_layers_torch_ops(use_qk_norm, unit_offset, lead, rotary):
    """GatedAttention's q / k heads (q a strided view of q_proj's interleaved query and gate
    output; [B, T] or packed [N] tokens) through the kernel equal the torch norms and apply_rope
    within float32 rounding, the layer's output likewise; a token's result does not depend on the
    others."""
    from mtpx.models.attention import GatedAttention
    from mtpx.models.config import ModelConfig
    from mtpx.models.rope import apply_rope, rope_cos_sin
    cfg = ModelConfig(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      partial_rotary_factor=rotary, use_qk_norm=use_qk_norm, rms_norm_unit_offset=unit_offset)
    attn, g = GatedAttention(cfg), torch.Generator().manual_seed(4)
    for n in (attn.q_norm, attn.k_norm):
        if use_qk_norm:
            n.weight.data = torch.randn(16, generator=g) * 0.3 + (0.0 if unit_offset else 1.0)
    raw = torch.randn(*lead, 4, 32, generator=g)
    q, k = raw[..., :16], torch.randn(*lead, 2, 16, generator=g)
    cos, sin = rope_cos_sin(torch.randint(0, 900, lead, generator=g), cfg.rotary_dim, 1e4, torch.float32)
    with torch.inference_mode():
        assert attn._fused_qk(q, k, cos)
        qn, kn = attn.q_norm, attn.k_norm
        out = (cpu_ops.qk_norm_rope(q, k, qn.weight, kn.weight, qn.eps, qn.unit_offset, cos, sin)
               if use_qk_norm
               else cpu_ops.qk_norm_rope(q, k, None, None, 0.0, False, cos, sin))
        ref = apply_rope(qn(q) if not use_qk_norm else qn._reference(q), cos, sin), apply_rope(
            kn(k) if not use_qk_norm else kn._reference(k), cos, sin)
        one = cpu_ops.qk_norm_rope(q[:1], k[:1],
                                   *((qn.weight, kn.weight, qn.eps, qn.unit_offset) if use_qk_norm
                                    else (None, None, 0.0, False)), cos[:1], sin[:1])
        x = torch.randn(*lead, 48, generator=g)
        fast = attn(x, cos, sin) if len(lead) == 2 else None          # the layer over a [B, T] grid
        cpu_ops.use_kernel = False
        try:
            slow = attn(x, cos, sin) if len(lead) == 2 else None
        finally:
            cpu_ops.use_kernel = True
    for o, r, o1 in zip(out, ref, one):
        assert o.shape == r.shape and o.is_contiguous()
        torch.testing.assert_close(o, r, rtol=2e-6, atol=2e-6)
        assert torch.equal(o1, o[:1])
    if fast is not None:
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,n_in,n_out,bias",
                         [(1, 128, 384, False), (9, 384, 128, True), (64, 20, 13, False),
                          (5, 7, 8, True), (3, 128, 1, False)])
def test_linear_equals_f_linear_and_a_row_does_not_depend_on_its_batch(rows, n_in, n_out, bias):
    """cpu_ops.linear (mtpx/kernels/linear.c) equals F.linear within float32 rounding for any
    input and output width (the kernel's 8-wide tails), with or without bias, from a strided x;
    every row equals itself computed alone, bit for bit (a verification window and a decode step
    see the same weights' sums)."""
    from mtpx.models.linear import Linear
    g = torch.Generator().manual_seed(5)
    lin = Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n_out, n_in, generator=g) * 0.2)
        if bias:
            lin.bias.copy_(torch.randn(n_out, generator=g))
    wide = torch.randn(rows, 2 * n_in, generator=g)
    x = wide[:, ::2]                                                    # a strided input
    with torch.inference_mode():
        assert cpu_ops.linear_runs(x, lin.weight)
        y = lin(x)
        ref = torch.nn.functional.linear(x, lin.weight, lin.bias)
        assert y.shape == ref.shape and y.is_contiguous()
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
        assert all(torch.equal(lin(x[i: i + 1]), y[i: i + 1]) for i in range(rows))
        assert torch.equal(lin(x[None]), y[None])                       # leading dims kept
    assert lin(x).grad_fn is not None                                   # with gradients: F.linear


def test_linear_takes_the_blas_above_its_row_limit_and_off_the_kernel(monkeypatch):
    from mtpx.models.linear import Linear
    lin, calls, kernel = Linear(16, 8), [], cpu_ops.linear
    monkeypatch.setattr(cpu_ops, "linear", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    with torch.inference_mode():
        lin(torch.randn(cpu_ops.LINEAR_MAX_ROWS, 16))
        lin(torch.randn(cpu_ops.LINEAR_MAX_ROWS + 1, 16))               # a prefill chunk: the BLAS
        lin(torch.randn(4, 16))
        lin.double()(torch.randn(2, 16, dtype=torch.float64))           # other dtypes: F.linear
    with torch.no_grad():
        lin.float()(torch.randn(2, 16))                                 # a training evaluation
    assert calls == [(cpu_ops.LINEAR_MAX_ROWS, 16), (4, 16)]
    wide, threads = Linear(16, cpu_ops.LINEAR_PARALLEL_MACS // (16 * 8)), torch.get_num_threads()
    try:
        # a big one with several threads: the BLAS's threads; one thread: the kernel
        for n in (2, 1):
            torch.set_num_threads(n)
            with torch.inference_mode():
                wide(torch.randn(8, 16))
    finally:
        torch.set_num_threads(threads)
    assert calls[2:] == [(8, 16)]


def test_a_compiled_graph_calls_the_linear_operator_and_equals_eager():
    """Under torch.compile without gradients a Linear over few rows is the operator mtpx::linear
    (the same kernel: the same values as eager, bit for bit; with more rows it runs F.linear, as
    eager does); with gradients, F.linear."""
    from mtpx.models.linear import Linear
    lin, x = Linear(16, 24), torch.randn(3, 16)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    for rows, grad in ((3, False), (3, True), (cpu_ops.LINEAR_MAX_ROWS + 1, False)):
        torch._dynamo.reset()
        xr = torch.randn(rows, 16)
        with torch.set_grad_enabled(grad):
            out = torch.compile(lin, backend=backend, fullgraph=True, dynamic=False)(xr)
        if not grad and rows <= cpu_ops.LINEAR_MAX_ROWS:
            with torch.inference_mode():
                assert torch.equal(out, lin(xr))                        # eager: the kernel too
    assert ["mtpx.linear" in g for g in graphs] == [True, False, True]   # more rows: F.linear inside
    with torch.inference_mode():
        assert torch.equal(torch.ops.mtpx.linear(x, lin.weight, lin.bias), lin(x))


def test_one_compiled_graph_serves_every_batch_size():
    """With a dynamic batch size the graph has no guard on the rows (the operator picks the kernel
    or F.linear when it runs), so batches on both sides of LINEAR_MAX_ROWS share one graph, inside
    a nested compile region as the engine's layer regions are, each equal to eager bit for bit."""
    from mtpx.models.linear import Linear
    lin = Linear(16, 24)
    region = torch.compiler.nested_compile_region(lambda x: lin(x) * 2)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.print_readable(print_output=False))
        return gm.forward

    step = torch.compile(lambda x: region(x) + region(x + 1), backend=backend, fullgraph=True, dynamic=True)
    m = cpu_ops.LINEAR_MAX_ROWS
    with torch.no_grad():
        for rows in (3, m - 1, m, m + 1, 2 * m + 5, 5):
            x = torch.randn(rows, 16)
            out = step(x)
            with torch.inference_mode():
                assert torch.equal(out, lin(x) * 2 + lin(x + 1) * 2), rows
    assert len(graphs) == 1 and "mtpx.linear" in graphs[0]


def test_engine_tokens_equal_with_and_without_the_kernel(monkeypatch):
    """mtp8 greedy decoding on the demo checkpoint (the target's verification windows and the
    draft modules): the same tokens either way (plain decoding equals mtp8 in other tests)."""
    from mtpx import LLM, SamplingParams
    prompts = ["def fibonacci(n):", "The quick brown fox", "import os\nimport sys\n", "for i in range(10):"]
    outs = []
    for kernel in (False, True):
        monkeypatch.setattr(cpu_ops, "use_kernel", kernel)
        llm = LLM(model=str(ROOT / "checkpoints" / "demo"), max_num_seqs=4, spec="mtp8",
                  num_speculative_tokens=8)
        res = llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0.0))
        outs.append([o.outputs[0].token_ids for o in res])
    assert outs[0] == outs[1]
