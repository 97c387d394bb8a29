"""The packed prefill: Gated DeltaNet's conv and recurrence on the real tokens alone, in chunks
that never cross a request (chunk_gated_delta_rule_packed, GatedDeltaNet._forward_packed)."""
from __future__ import annotations

import random

import pytest
import torch

from mtpx.models.deltanet import GatedDeltaNet
from mtpx.models.gated_delta_rule import PackedChunks, chunk_gated_delta_rule, chunk_gated_delta_rule_packed
from tests.helpers import _params, assert_clean, install_draft_check, make_llm, run_checked
from tests.test_auto_k import model            # the peaked tiny model (float64), built once


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("chunk", [4, 16])
def test_packed_chunks_equal_the_reference_per_sequence(dtype, tol, chunk):
    """Outputs, final states and every chunk-end state of sequences of 1, 15, 16, 17, 40, 3 and
    64 tokens packed together equal chunk_gated_delta_rule run on each alone."""
    g = torch.Generator().manual_seed(0)
    lengths, H, Dk, Dv = [1, 15, 16, 17, 40, 3, 64], 4, 8, 12
    N, B = sum(lengths), len(lengths)
    q, k = (torch.randn(N, H, Dk, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(N, H, Dv, generator=g, dtype=dtype)
    gate, beta = -torch.rand(N, H, generator=g, dtype=dtype), torch.rand(N, H, generator=g, dtype=dtype)
    init = 0.1 * torch.randn(B, H, Dk, Dv, generator=g, dtype=dtype)
    chunks = PackedChunks.build(lengths, chunk, "cpu")
    o, final, states = chunk_gated_delta_rule_packed(q, k, v, gate, beta, chunks, init,
                                                     return_chunk_states=True)
    assert o.shape == (N, H, Dv) and o.dtype == dtype and final.shape == (B, H, Dk, Dv)
    start = 0
    for b, n in enumerate(lengths):
        s = slice(start, start + n)
        ro, rf, rs = chunk_gated_delta_rule(q[None, s], k[None, s], v[None, s], gate[None, s], beta[None, s],
                                            init[b: b + 1], chunk_size=chunk, return_chunk_states=True)
        torch.testing.assert_close(o[s], ro[0], rtol=0, atol=tol)
        torch.testing.assert_close(final[b], rf[0], rtol=0, atol=tol)
        for j in range(rs.shape[1]):
            torch.testing.assert_close(states[chunks.base[j] + int(chunks.rank[b])], rs[0, j], rtol=0,
                                       atol=tol)
        start += n


def _workload(seed: int, n: int = 6, max_tokens: tuple[int, int] = (4, 12)):
    """Prompts of 17-60 tokens, some sharing a 24-token prefix (prefix caching), with stops."""
    g = random.Random(seed)
    base = [g.randrange(2, 64) for _ in range(60)]
    prompts = [base[: g.randrange(24, 60)] if i % 2
               else [g.randrange(2, 64) for _ in range(g.randrange(17, 60))]
               for i in range(n)]
    params = [_params(g.randrange(*max_tokens), stop=g.choice([None, base[30]])) for _ in prompts]
    return prompts, params


@pytest.mark.parametrize("spec,k", [(None, None), ("mtp8", 4)])
@pytest.mark.parametrize("prefix,block_size,chunked,small_pool",
                         [(False, 16, False, False), (True, 4, False, False), (True, 16, True, False),
                          (False, 8, True, True)])
def test_the_packed_prefill_keeps_greedy_output_and_states_exact(spec, k, prefix, block_size, chunked,
                                                                  small_pool, monkeypatch):
    """Engines whose prefills run packed (prompts longer than 16 tokens, different lengths in one
    step) give plain greedy decoding's tokens, every draft equal to its from-scratch value, and
    the padded grid's tokens; with prefix caching (boundary states at block ends), chunked
    prefill and preemption."""
    ran = []
    forward_packed = GatedDeltaNet._forward_packed
    monkeypatch.setattr(GatedDeltaNet, "_forward_packed",
                        lambda self, *a: (ran.append(1), forward_packed(self, *a))[1])
    prompts, params = _workload(block_size, max_tokens=(20, 28) if small_pool else (4, 12))
    results = {}
    for ragged in (True, False):
        kw = dict(max_num_batched_tokens=48) if chunked else {}
        if small_pool:
            kw["num_blocks"] = 16
        llm = make_llm(model(), spec, k, enable_prefix_caching=prefix, max_num_seqs=4, block_size=block_size,
                       ragged_batch=ragged, **kw)
        checked = install_draft_check(llm, model(), spec, k) if spec else []
        outs, _ = run_checked(llm, model(), prompts, params)
        assert all(c[0] for c in checked), [c[1:] for c in checked if not c[0]][:2]
        assert_clean(llm)
        results[ragged] = [o.output_token_ids for o in outs]
        if ragged:
            assert ran, "no prefill ran packed"
        if small_pool:
            assert llm.engine.scheduler.num_preemptions > 0
    assert results[True] == results[False]
