"""Penalties and min_tokens on trees (mtpx/engine/tree_logits.py): each node's logits are processed
as if its own path were committed, so trees emit exactly what plain decoding emits, greedy and
seeded, with repetition / frequency / presence penalties and a stop token masked by min_tokens,
while accepting paths through second-ranked children."""
from __future__ import annotations

import pytest
import torch

from mtpx import LLM, SamplingParams
from mtpx.engine.tree_logits import process_tree_logits
from mtpx.spec_decode.tree import build_tree_shape

PROMPTS = [[5, 8, 11, 14], [20], [3, 4, 5, 6, 7, 8, 9], [40, 42, 44], [9, 9, 9, 9], [61, 2, 7, 33, 12]]


def _params(stop: int, temperature: float = 0.0, seed: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=14, min_tokens=6, stop_token_ids=[stop], repetition_penalty=1.3,
                          frequency_penalty=0.4, presence_penalty=0.2, ignore_eos=True,
                          temperature=temperature, seed=seed)


@pytest.mark.parametrize("spec,tree", [("mtp8", [2, 2, 1]), ("mtp1", [2, 1, 1])])
def test_penalties_and_min_tokens_on_trees_equal_plain(trained_tiny, spec, tree):
    plain = LLM(model=trained_tiny)
    free = plain.generate(PROMPTS[:1], SamplingParams(max_tokens=6, ignore_eos=True, repetition_penalty=1.3,
                                                      frequency_penalty=0.4, presence_penalty=0.2))
    stop = free[0].output_token_ids[2]             # emitted before min_tokens: masked there
    params = [_params(stop) if i % 2 == 0 else _params(stop, 0.8, seed=i) for i in range(len(PROMPTS))]
    want = [o.output_token_ids for o in plain.generate(PROMPTS, params)]
    llm = LLM(model=trained_tiny, spec=spec, tree=tree, max_num_seqs=4)
    outs = llm.generate(PROMPTS, params)
    assert [o.error for o in outs] == [None] * len(PROMPTS)
    assert [o.output_token_ids for o in outs] == want
    assert all(len(w) >= 6 for w in want) and any(len(w) < 14 for w in want)     # min_tokens, then the stop
    ranks = llm.engine.runner.tree_stats.rank_counts
    assert sum(sum(row[1:]) for row in ranks) > 0, ranks


def test_each_node_counts_its_own_path():
    """A [2, 1] tree: nodes 1, 2 (tokens 3, 4) below the root, node 3 (token 3) below node 1, node 4
    (token 5) below node 2. Frequency penalty 1: node 3's column counts token 3 twice (nodes 1 and
    3), node 4's counts 4 and 5 once and 3 not at all; with one output token, min_tokens 2 masks the
    stop id 0 at the root's column only (depth 0: output token 1; depth 1: output token 2)."""
    shape = build_tree_shape([2, 1])
    parents, depths, _ = (x[None] for x in shape.tensors())
    ids = torch.tensor([[7, 3, 4, 3, 5]])

    class R:
        params = SamplingParams(max_tokens=9, frequency_penalty=1.0, min_tokens=2, stop_token_ids=[0])
        output_token_ids, prompt_token_ids, stop_ids, bad_words_token_ids, grammar = [7], [1], {0}, [], None
    out = process_tree_logits([R()], torch.zeros(1, 5, 8), ids, parents, depths, shape.depth)[0]
    counts = torch.zeros(5, 8)
    counts[:, 7] = 1
    for t, path in enumerate([[], [3], [4], [3, 3], [4, 5]]):
        for tok in path:
            counts[t, tok] += 1
    want = -counts
    want[0, 0] = float("-inf")
    torch.testing.assert_close(out, want)
