"""Verification at temperature > 0 (mtpx/spec_decode/verification.py): exact acceptance probabilities on
hand-made p and q, exact losslessness by enumerating every draft block and every outcome on a tiny
vocabulary with context-dependent target and draft distributions, block >= token level in expected
accepted tokens, and a seeded Monte-Carlo check of the samplers themselves."""
from collections import defaultdict
from itertools import product
from math import prod

import pytest
import torch

from mtpx.spec_decode.verification import (block_thresholds, residual, token_acceptance_probs,
                                    verify_block, verify_token_level)

V = 3


def _tables(seed: int, K: int, one_hot_draft: bool = False):
    """Target and draft distributions for every prefix of length <= K + 1 (float64); the draft
    puts zero mass on some tokens, or is one-hot (greedy drafts)."""
    g = torch.Generator().manual_seed(seed)
    P, Q = {}, {}
    for n in range(K + 2):
        for prefix in product(range(V), repeat=n):
            P[prefix] = _dirichlet(g)
            q = _dirichlet(g)
            if one_hot_draft:
                q = torch.nn.functional.one_hot(q.argmax(), V).double()
            elif torch.rand(1, generator=g).item() < 0.3:
                q[torch.randint(V, (1,), generator=g)] = 0
                q = q / q.sum()
            Q[prefix] = q
    return P, Q


def _dirichlet(g):
    x = -torch.rand(V, generator=g, dtype=torch.float64).log()
    return x / x.sum()


def _tensors(x, P, Q, K):
    """Row tensors for one draft block x (length K): q [1, K, V], p [1, K + 1, V]."""
    q = torch.stack([Q[tuple(x[:i])] for i in range(K)])[None]
    p = torch.stack([P[tuple(x[:i])] for i in range(K + 1)])[None]
    return torch.tensor([list(x)]), q, p


def _outcome_probs(method, x, q, p, Kb):
    """[(num_accepted, probability, final distribution)] for one draft block, exactly."""
    K = x.shape[1]
    nd = torch.tensor([Kb])
    out = []
    if method == "standard":
        a = token_acceptance_probs(x, q, p)[0].tolist()
        for j in range(Kb + 1):
            pj = prod(a[:j]) * (1 - a[j] if j < Kb else 1)
            final = residual(p[0, j], q[0, min(j, K - 1)]) if j < Kb else p[0, Kb]
            out.append((j, pj, final))
    else:
        h, w = block_thresholds(x, q, p, nd)
        h = h[0].tolist()
        for j in range(Kb + 1):
            pj = (h[j - 1] if j else 1) * prod(1 - h[i] for i in range(j, Kb))
            final = residual(p[0, j], q[0, min(j, K - 1)], w[0, j]) if j < Kb else p[0, Kb]
            out.append((j, pj, final))
    return out


def _emitted_distribution(method, P, Q, K, Kb):
    """Exact distribution of the first Kb + 1 tokens: the verifier's output, continued by sampling
    from the target up to that length. Lossless iff it equals the target's joint distribution."""
    dist = defaultdict(float)
    for xs in product(range(V), repeat=Kb):
        x_full = list(xs) + [0] * (K - Kb)
        q_prob = prod(Q[tuple(xs[:i])][xs[i]].item() for i in range(Kb))
        if q_prob == 0:
            continue
        x, q, p = _tensors(x_full, P, Q, K)
        for j, pj, final in _outcome_probs(method, x, q, p, Kb):
            for y in range(V):
                seq = tuple(xs[:j]) + (y,)
                base = q_prob * pj * final[y].item()
                if base == 0:
                    continue
                for cont in product(range(V), repeat=Kb - j):
                    s = seq + cont
                    dist[s] += base * prod(P[s[:t]][s[t]].item() for t in range(len(seq), Kb + 1))
    return dist


def _target_distribution(P, L):
    return {s: prod(P[s[:t]][s[t]].item() for t in range(L)) for s in product(range(V), repeat=L)}


def test_hand_made_acceptance_and_residual():
    p = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]], dtype=torch.float64)
    q = torch.tensor([[[0.2, 0.6, 0.2]]], dtype=torch.float64)
    for tok, want in ((0, 1.0), (1, 0.5), (2, 1.0)):
        assert token_acceptance_probs(torch.tensor([[tok]]), q, p).item() == pytest.approx(want)
    assert residual(p[0, 0], q[0, 0]).tolist() == pytest.approx([1.0, 0.0, 0.0])
    # greedy draft (one-hot q): accept with p(x); the residual is p without x, renormalised
    onehot = torch.tensor([[[0.0, 1.0, 0.0]]], dtype=torch.float64)
    assert token_acceptance_probs(torch.tensor([[1]]), onehot, p).item() == pytest.approx(0.3)
    assert residual(p[0, 0], onehot[0, 0]).tolist() == pytest.approx([0.5 / 0.7, 0.0, 0.2 / 0.7])


def test_paper_example_expected_accepted_tokens():
    """Sun et al.'s motivating example: context-independent M_b = (1/3, 2/3), M_s = (2/3, 1/3),
    two drafts: token level accepts 10/9 tokens per block in expectation, block verification 11/9."""
    pb = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    ps = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    exp = {"standard": 0.0, "block": 0.0}
    for xs in product(range(2), repeat=2):
        x = torch.tensor([list(xs)])
        q, p = ps.expand(1, 2, 2), pb.expand(1, 3, 2)
        w = prod(ps[t].item() for t in xs)
        for method in exp:
            exp[method] += w * sum(j * pj for j, pj, _ in _outcome_probs(method, x, q, p, 2))
    assert exp["standard"] == pytest.approx(10 / 9, abs=1e-12)
    assert exp["block"] == pytest.approx(11 / 9, abs=1e-12)


@pytest.mark.parametrize("method", ["standard", "block"])
@pytest.mark.parametrize("seed,K,Kb,one_hot", [(0, 2, 2, False), (1, 3, 3, False), (2, 3, 2, False),
                                               (3, 3, 3, True), (4, 1, 1, False), (5, 2, 1, True)])
def test_output_distribution_equals_target_exactly(method, seed, K, Kb, one_hot):
    P, Q = _tables(seed, K, one_hot)
    got = _emitted_distribution(method, P, Q, K, Kb)
    want = _target_distribution(P, Kb + 1)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    for s, v in want.items():
        assert got.get(s, 0.0) == pytest.approx(v, abs=1e-12), s


@pytest.mark.parametrize("seed", range(8))
def test_block_never_accepts_fewer_than_token_level(seed):
    K = 3
    P, Q = _tables(100 + seed, K, one_hot_draft=seed % 4 == 3)
    exp = {"standard": 0.0, "block": 0.0}
    for xs in product(range(V), repeat=K):
        w = prod(Q[tuple(xs[:i])][xs[i]].item() for i in range(K))
        if w == 0:
            continue
        x, q, p = _tensors(list(xs), P, Q, K)
        for method in exp:
            exp[method] += w * sum(j * pj for j, pj, _ in _outcome_probs(method, x, q, p, K))
    assert exp["block"] >= exp["standard"] - 1e-12


@pytest.mark.parametrize("method,fn", [("standard", verify_token_level), ("block", verify_block)])
def test_samplers_match_the_exact_distribution(method, fn):
    """The verifiers with sampled uniforms and final tokens: total-variation distance to the target
    joint of the first 3 tokens below 0.02 over 40,000 seeded samples (the sampling error of an
    empirical distribution over 27 outcomes is about 0.01)."""
    K, N = 2, 40_000
    P, Q = _tables(7, K)
    g = torch.Generator().manual_seed(0)
    # draft blocks sampled from the draft distributions, then one verification each
    xs = torch.zeros(N, K, dtype=torch.long)
    for i in range(K):
        qd = torch.stack([Q[tuple(r[:i])] for r in xs.tolist()])
        xs[:, i] = torch.multinomial(qd, 1, generator=g)[:, 0]
    rows = xs.tolist()
    q = torch.stack([torch.stack([Q[tuple(r[:i])] for i in range(K)]) for r in rows])
    p = torch.stack([torch.stack([P[tuple(r[:i])] for i in range(K + 1)]) for r in rows])
    m, final = fn(xs, q, p, torch.full((N,), K), torch.rand(N, K, generator=g, dtype=torch.float64))
    y = torch.multinomial(final, 1, generator=g)[:, 0]
    counts = defaultdict(int)
    for r, mi, yi in zip(rows, m.tolist(), y.tolist()):
        s = tuple(r[:mi]) + (yi,)
        while len(s) < K + 1:                                # continue with the target
            s = s + (int(torch.multinomial(P[s], 1, generator=g)),)
        counts[s] += 1
    want = _target_distribution(P, K + 1)
    tv = 0.5 * sum(abs(counts.get(s, 0) / N - v) for s, v in want.items())
    assert tv < 0.02, (method, tv)
