"""Sampling at temperature > 0 on trees (mtpx/spec_decode/tree_sampling.py): the rule equals
recursive rejection exactly, its output distribution is the target's (a hand-made tree and tables,
and through the engine), and a seeded request's tokens do not depend on its batch-mates or on the
tree's shape: they equal plain seeded sampling's, on the float64 tiny hybrid.

The distribution checks follow tests/test_verification.py (40,000 draws from hand-made tables,
TV below 0.02) and tests/test_sampling.py (4,000 seeded requests through the engine, the joint of
the first 3 tokens, TV below 0.08); each has a power check: the same threshold catches a rule that
reuses one uniform at every depth. The engine's distribution check is slow (about 4 minutes on 2
busy cores): `python -m pytest -q -m slow tests/test_tree_sampling.py`."""
from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch

from mtpx import LLM, SamplingParams
from mtpx.spec_decode.tree import build_tree_shape, greedy_walk
from mtpx.spec_decode.tree_sampling import node_targets
from tests.test_sampling import N as N_ENGINE, PROMPT, TV_MAX, _model_v8, exact_joint, tv

V = 5
# a hand-made tree below the root: nodes 1, 2 hold tokens 1, 3 (the root's children); node 1's
# children 3, 4 hold tokens 0, 2; node 2's child 5 holds token 4
TOKENS = [0, 1, 3, 0, 2, 4]
PARENTS = [-1, 0, 0, 1, 1, 2]
DEPTHS = [0, 1, 1, 2, 2, 2]


def _tables(seed: int, depth: int) -> dict:
    """P[prefix]: a target distribution over V tokens after each prefix of up to `depth` tokens,
    random, with some extra mass on the tree's children (so that paths get accepted)."""
    g = torch.Generator().manual_seed(seed)
    paths = _node_paths()
    P, level = {}, [()]
    for _ in range(depth + 1):
        for s in level:
            x = torch.rand(V, generator=g, dtype=torch.float64).pow(3).add(1e-3)
            if s in paths:
                for c in range(len(TOKENS)):
                    if PARENTS[c] == paths.index(s):
                        x[TOKENS[c]] += 0.4
            P[s] = x / x.sum()
        level = [s + (t,) for s in level for t in range(V)]
    return P


def _node_paths() -> list[tuple[int, ...]]:
    paths = []
    for t in range(len(TOKENS)):
        p, c = [], t
        while c > 0:
            p.insert(0, TOKENS[c])
            c = PARENTS[c]
        paths.append(tuple(p))
    return paths


def _tree_draws(P: dict, n: int, u: torch.Tensor) -> list[tuple[int, ...]]:
    """n emissions of the tree rule with uniforms u [n, 3], continued with the target to 3 tokens."""
    paths = _node_paths()
    probs = torch.stack([P[p] for p in paths])[None].expand(n, -1, -1)
    T = len(TOKENS)
    depths = torch.tensor(DEPTHS).expand(n, T)
    target = node_targets(probs, depths, u)
    tokens, parents = torch.tensor(TOKENS).expand(n, T), torch.tensor(PARENTS).expand(n, T)
    accepted, path = greedy_walk(tokens, parents, depths, torch.ones(n, T, dtype=torch.bool), target, 2)
    emitted = target.gather(1, path).tolist()
    g = torch.Generator().manual_seed(1)
    out = []
    for m, e in zip(accepted.tolist(), emitted):
        s = tuple(e[: m + 1])
        while len(s) < 3:
            s = s + (int(torch.multinomial(P[s], 1, generator=g)),)
        out.append(s)
    return out


def _tv_to_target(P: dict, draws: list) -> float:
    want = {}
    for s in [(a, b, c) for a in range(V) for b in range(V) for c in range(V)]:
        want[s] = float(P[()][s[0]] * P[s[:1]][s[1]] * P[s[:2]][s[2]])
    counts = defaultdict(int)
    for s in draws:
        counts[s] += 1
    return 0.5 * sum(abs(counts.get(s, 0) / len(draws) - w) for s, w in want.items())


def recursive_rejection(p: torch.Tensor, children: list[int]) -> torch.Tensor:
    """SpecInfer's multi-draft rule with one-hot drafts, exactly: the probability that the
    position emits each token (accepting child c_i, or sampling the residual)."""
    out = torch.zeros_like(p)
    rest, reach = p.clone(), 1.0                  # rest: p with the rejected children removed (unnormalised)
    for c in children:
        accept = rest[c] / rest.sum()
        out[c] += reach * accept
        reach *= 1 - accept
        rest[c] = 0
    return out + reach * rest / rest.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_rule_is_recursive_rejection(seed):
    """Emitting y ~ p and descending into the child equal to y gives each child p(child) and each
    other token p(token): what recursive rejection over the children gives (float64, 1e-12)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(11, generator=g, dtype=torch.float64) ** 2
    p /= p.sum()
    for children in ([3], [3, 7], [0, 10, 4, 5]):
        torch.testing.assert_close(recursive_rejection(p, children), p, rtol=0, atol=1e-12)


def test_tree_rule_matches_the_target_distribution():
    """40,000 emissions of the hand-made tree: the joint of the first 3 tokens within TV 0.02 of
    the target's (about 0.01 is sampling error over 125 outcomes); accepted paths reach depth 2
    and take second-ranked children. One uniform shared by every depth fails the same check."""
    P, n = _tables(3, 2), 40_000
    u = torch.rand(n, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    draws = _tree_draws(P, n, u)
    tv_ok = _tv_to_target(P, draws)
    assert tv_ok < 0.02, tv_ok
    assert sum(s[:2] in {(1, 0), (1, 2), (3, 4)} for s in draws) > 0.02 * n     # depth-2 paths
    tv_bad = _tv_to_target(P, _tree_draws(P, n, u[:, :1].expand(n, 3)))
    assert tv_bad > 2.5 * 0.02, tv_bad


def _tree_llm(model, tree, **kw):
    return LLM(model=model, spec="mtp8", tree=tree, max_num_seqs=512, max_num_batched_tokens=8192, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("tree", [[2, 2], [[0], [1], [0, 0], [0, 1]]], ids=["2,2", "leaves"])
def test_engine_tree_sampling_matches_target_distribution(tree):
    """tests/test_sampling.py's check (the vocabulary-8 peaked model, temperature 1.5, 4,000 seeded
    requests, the joint of the first 3 tokens) with an mtp8 tree [2, 2] and 6 tokens a request (so
    that the first round verifies second-ranked children too: with 3 the scheduler lets it verify one
    draft): TV to the exact joint below TV_MAX, with accepted paths through a second-ranked child;
    and with the leaf tree of the same depth (the chain and a second choice at depths 1 and 2,
    drafted by the chain's round: mtpx/spec_decode/tree_leaves.py)."""
    model = _model_v8()
    params = SamplingParams(temperature=1.5, top_k=4)
    llm = _tree_llm(model, tree)
    outs = llm.generate([PROMPT] * N_ENGINE, [SamplingParams(max_tokens=6, temperature=1.5, top_k=4, seed=i,
                                                             ignore_eos=True) for i in range(N_ENGINE)])
    counts = Counter(tuple(o.output_token_ids[:3]) for o in outs)
    d = tv(counts, exact_joint(model, params))
    stats = llm.engine.runner.tree_stats
    assert d < TV_MAX, d
    assert sum(o.spec.num_accepted_tokens for o in outs) > 0.05 * N_ENGINE
    assert sum(sum(row[1:]) for row in stats.rank_counts) > 0.01 * N_ENGINE, stats.rank_counts


SEEDED_TREES = [("mtp8", [2, 2, 1]), ("mtp8", [[0], [1], [2], [0, 0], [0, 0, 0], [1, 0]]), ("mtp1", [3, 1]),
                ("mtp8", {"num_draft_tokens": 6, "depth": 3, "topk": 2}), ("mtp8", [1, 3]),
                ("mtp8", [1, 1, 1])]


def test_seeded_tree_sampling_equals_plain_seeded_sampling(trained_tiny):
    """A seeded request at temperature 1.0 / top-p 0.9 emits the same tokens as plain seeded
    sampling, alone and among 7 seeded and greedy batch-mates, for three tree shapes, a dynamic
    tree (each request's own tree every step) and a leaf tree ([1, 3]: the chain's round drafts
    it); the chain [1, 1, 1] differs: its verification draws one uniform per draft."""
    mine = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    plain = LLM(model=trained_tiny).generate([PROMPT], [mine])[0].output_token_ids
    others = [SamplingParams(max_tokens=5 + i, temperature=0.0 if i % 3 == 0 else 0.7 + 0.1 * i, seed=i,
                             ignore_eos=True) for i in range(7)]
    prompts = [[(3 * i + j) % 64 for j in range(1 + i % 7)] for i in range(7)]
    accepted = 0
    for spec, tree in SEEDED_TREES:
        llm = LLM(model=trained_tiny, spec=spec, tree=tree, max_num_seqs=8)
        alone = llm.generate([PROMPT], [mine])[0]
        if tree == [1, 1, 1]:
            assert alone.output_token_ids != plain
            continue
        batch = llm.generate(prompts[:3] + [PROMPT] + prompts[3:], others[:3] + [mine] + others[3:])
        assert alone.output_token_ids == plain, (spec, tree)
        assert batch[3].output_token_ids == plain, (spec, tree)
        accepted += alone.spec.num_accepted_tokens
    assert accepted > 10


def test_probabilistic_drafts_are_refused(trained_tiny):
    with pytest.raises(ValueError, match=r"^spec.tree with spec.draft_sample_method=probabilistic: not "):
        LLM(model=trained_tiny, spec="mtp8", tree=[2, 1], draft_sample_method="probabilistic")


def test_greedy_rows_next_to_sampled_ones_stay_plain(trained_tiny):
    """A batch mixing temperature 0 and 1 takes the sampling path; its greedy rows still emit
    plain greedy tokens."""
    prompts = [[(5 * i + j) % 64 for j in range(2 + i % 5)] for i in range(6)]
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)
    plain = [o.output_token_ids for o in LLM(model=trained_tiny).generate(prompts, greedy)]
    params = [greedy if i % 2 == 0 else SamplingParams(max_tokens=12, temperature=1.0, seed=i,
                                                       ignore_eos=True) for i in range(6)]
    outs = LLM(model=trained_tiny, spec="mtp8", tree=[2, 2, 1]).generate(prompts, params)
    assert [outs[i].output_token_ids for i in range(0, 6, 2)] == plain[0::2]
    assert build_tree_shape([2, 2, 1]).num_nodes == 10
