"""The decode step of tree drafting (`spec.tree`, mtpx/spec_decode/tree.py), eager; sampling at
temperature > 0 as in mtpx/spec_decode/tree_sampling.py.

One target forward over every request's tree [x_n, node 1 .. node N'] (N' = the drafts the
scheduler let it verify: a breadth-first prefix of the tree, itself a tree): node t's KV is
written at position n + t's slot, RoPE at n + depth(t), attention reads the committed KV and the
node's ancestors, Gated DeltaNet steps each node from its parent's state
(mtpx/models/tree_forward.py). Verification walks the tree along the target's (seeded) samples
(`greedy_walk`); then the accepted path's KV is moved to positions n + 1 .. n + m (its nodes sit
at n + path[d] >= n + d, so moving in order of depth never overwrites a node still to move), the
Gated DeltaNet state after the last accepted node is kept and the boundary states of the accepted
positions stored with their blocks, and the speculator runs its round on the accepted path's
hidden states, as a chain round that accepted the same tokens would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from mtpx.engine.compiled_tree import TreeGraphs, draft_tree, static_window, verify_tree
from mtpx.engine.logits import logprobs
from mtpx.engine.tree_logits import process_tree_logits
from mtpx.models.tree_forward import commit_tree_states
from mtpx.spec_decode.tree import DynamicTree, depth_levels, greedy_walk
from mtpx.spec_decode.tree_sampling import tree_targets


@dataclass
class TreeStats:
    """What tree verification did over an engine's life (metrics.json's "tree"): steps (decode
    steps), rounds (requests that verified drafts, summed over steps: vLLM's num_drafts), nodes
    (draft nodes verified), and rank_counts[d][r]: accepted paths whose node at depth d + 1 was its
    parent's rank-r child (rank 0: the draft's first choice)."""

    paths: list
    steps: int = 0
    rounds: int = 0
    nodes: int = 0
    rank_counts: list = field(default_factory=list)

    def record(self, nd_host: list[int], depth_rank: list[tuple[int, int]]) -> None:
        self.steps += 1
        self.rounds += sum(1 for x in nd_host if x)
        self.nodes += sum(nd_host)
        for d, r in depth_rank:
            while len(self.rank_counts) <= d:
                self.rank_counts.append([])
            row = self.rank_counts[d]
            row += [0] * (r + 1 - len(row))
            row[r] += 1

    def summary(self) -> dict:
        """{"paths", "rounds", "nodes_per_round", "accepted_path_length" (accepted nodes / rounds),
        "nodes_per_step", "per_depth_acceptance" (rounds reaching depth d + 1 / rounds),
        "accepted_rank_per_depth" (rank_counts)}."""
        per = max(self.rounds, 1)
        return {"paths": self.paths, "rounds": self.rounds, "nodes_per_round": self.nodes / per,
                "accepted_path_length": sum(map(sum, self.rank_counts)) / per,
                "nodes_per_step": self.nodes / max(self.steps, 1),
                "per_depth_acceptance": [sum(row) / per for row in self.rank_counts],
                "accepted_rank_per_depth": self.rank_counts}


def unsupported(params, acceptance: str = "lossless") -> str | None:
    """Why tree drafting cannot run a request with these SamplingParams under `spec.acceptance`
    (one line), or None."""
    if acceptance != "lossless" and not params.greedy:
        return (f"spec.tree with spec.acceptance={acceptance} and temperature > 0: not supported yet "
                "(a lossy rule verifies a tree greedily; set temperature=0)")
    if params.structured_outputs is not None or params.allowed_token_ids or params.bad_words:
        return ("spec.tree with structured_outputs, allowed_token_ids or bad_words: not supported yet "
                "(their masks follow one chain of drafts)")
    return None


def check_tree_engine(config, shape=None) -> None:
    """Raise ValueError (one line) for engine settings tree drafting (of `shape`, a TreeShape or a
    DynamicTree) does not support yet."""
    if config.compile and isinstance(shape, DynamicTree):
        raise ValueError("spec.tree as a dynamic tree (num_draft_tokens) with engine.compile=true: not "
                         "supported yet (compiled verification needs one static shape; give spec.tree "
                         "widths or paths, or set engine.compile=false)")
    if config.acceptance == "synthetic":
        raise ValueError("spec.tree with spec.acceptance=synthetic: not supported (its rates are per chain "
                         "position; use a chain, or another rule)")
    if config.draft_sample_method != "greedy":
        raise ValueError(f"spec.tree with spec.draft_sample_method={config.draft_sample_method}: not "
                         "supported (a tree's children are the draft's top-k; set it to greedy)")
    if config.attention_backend != "torch":
        raise ValueError("spec.tree with engine.attention_backend=flashinfer: not supported yet "
                         "(set engine.attention_backend=torch)")
    if config.tensor_parallel_size > 1:
        raise ValueError("spec.tree with engine.tensor_parallel_size > 1: not supported yet")


def tree_parts(config, step, spec) -> tuple[TreeStats | None, TreeGraphs | None]:
    """The TreeStats and (compiled `step`) TreeGraphs of an engine whose tree steps the
    TreeSpeculator `spec` drafts (None: no tree steps, (None, None)), after `check_tree_engine`."""
    if spec is None:
        return None, None
    check_tree_engine(config, spec.shape)
    return TreeStats([list(p) for p in spec.shape.paths]), TreeGraphs(step, spec) if step.static else None


def move_path_kv(cache, rows: torch.Tensor, n: torch.Tensor, path: torch.Tensor,
                 accepted: torch.Tensor) -> None:
    """The accepted nodes' target KV from position n + path[b, d] to n + d, d = 1 .. accepted[b]
    (module doc), in every target attention layer."""
    B, W = path.shape
    d = torch.arange(W, device=n.device).expand(B, W)
    move = (d >= 1) & (d <= accepted[:, None]) & (path != d)
    if not bool(move.any()):
        return
    bi = torch.arange(B, device=n.device)[:, None].expand(B, W)[move]
    S, table = cache.block_size, cache.block_tables[rows]

    def slots(pos):
        return table[bi, pos // S] * S + pos % S
    src, dst = slots(n[bi] + path[move]), slots(n[bi] + d[move])
    for c in cache.target:
        if hasattr(c, "write"):
            c.write(dst, c.k.flatten(0, 1)[src], c.v.flatten(0, 1)[src])


def tree_decode(runner, decodes, results: dict, propose_tree: bool = True) -> tuple[float, float]:
    """ModelRunner._decode for the runner's TreeSpeculator `tree_spec` (module doc): -> (verify_s,
    draft_s). propose_tree False (the automatic choice, mtpx/engine/tree_choice.py): the round after
    verification is the engine's chain speculator's, eager, proposing each request's num_new_drafts."""
    if not decodes:
        return 0.0, 0.0
    t0 = runner._now()
    cache, dev, spec = runner.cache, runner.device, runner.tree_spec
    reqs = [d.request for d in decodes]
    B = len(reqs)
    rows = torch.tensor([runner.rows[r.index] for r in reqs], device=dev)
    n_host = [r.num_tokens - 1 for r in reqs]
    nd_host = [d.num_draft_tokens for d in decodes]
    T = 1 + max(nd_host)
    if runner.step.static:            # compiled: one graph, the whole tree (mtpx/engine/compiled_tree.py)
        T = static_window(spec)[0]
    parents, depths, ranks = (x[:, :T] for x in spec.rows_tree(rows))   # padding: the row's tree's
    host_depths = depths.tolist()
    D = max(row[nd] for row, nd in zip(host_depths, nd_host))           # breadth first: the last's
    if runner.step.static:
        D = static_window(spec)[1]
    levels = depth_levels(host_depths)
    n = torch.tensor(n_host, device=dev)
    ids = torch.tensor([[r.all_token_ids[-1]] + list(r.draft_token_ids[:nd]) + [0] * (T - 1 - nd)
                        for r, nd in zip(reqs, nd_host)], device=dev)
    num_drafts = torch.tensor(nd_host, device=dev)
    valid = torch.arange(T, device=dev)[None] <= num_drafts[:, None]
    h, logits, kept = verify_tree(runner, ids, n, rows, num_drafts, valid, parents, depths, D, levels)
    processed = process_tree_logits(reqs, logits, ids, parents, depths, D)    # each node: its path committed
    target, uniforms = tree_targets(runner._sampling(reqs), processed, depths, D)
    rule = runner._verify_with[1]
    also = rule.tree_candidates(ids, parents, processed) if rule is not None and uniforms is None else None
    accepted, path = greedy_walk(ids, parents, depths, valid, target, D, also)
    if uniforms is not None:                  # seeded streams advance by the tokens emitted
        uniforms.settle((accepted + 1).tolist())
    emitted = target.gather(1, path)                                          # [B, D + 1]
    d = torch.arange(1, D + 1, device=dev)
    on_path = d[None] <= accepted[:, None]
    if also is not None:                       # a lossy rule's path keeps its drafts' tokens
        drafted = torch.where(on_path, ids.gather(1, path[:, 1:]), emitted[:, :D])
        emitted = torch.cat([drafted, emitted[:, D:]], 1)
    depth_rank = torch.stack([(d - 1).expand(B, D), ranks.gather(1, path[:, 1:])], -1)[on_path]
    runner.tree_stats.record(nd_host, depth_rank.tolist())
    move_path_kv(cache, rows, n, path, accepted)
    save = runner._boundaries(decodes, n_host, [1 + x for x in nd_host])
    if save is not None:            # boundary states of the accepted positions (pad block else)
        bi, ti, blocks = save
        node = path[bi, ti.clamp(max=D)]
        save = (bi, node, torch.where(ti <= accepted[bi], blocks, cache.pad_block))
    last_node = path.gather(1, accepted[:, None])[:, 0]                     # [B] the accepted path's end
    commit_tree_states(cache.recurrent, kept, rows, last_node, save)
    keep = torch.arange(D + 1, device=dev)[None] <= accepted[:, None]
    cache.write_tokens(torch.where(keep, rows[:, None], cache.pad_row),
                       n[:, None] + 1 + torch.arange(D + 1, device=dev), emitted)
    path_logits = logits.gather(1, path[..., None].expand(-1, -1, logits.shape[-1]))
    gaps = runner._gaps(path_logits)
    lps = logprobs([r.params.logprobs for r in reqs], path_logits, emitted)
    t1 = runner._now()
    final = n + accepted + 1
    hidden = h.gather(1, path[..., None].expand(-1, -1, h.shape[-1]))        # the path's h, positions n ..
    new = [d.num_new_drafts for d in decodes]
    batch = runner._draft_batch(reqs, rows, n + accepted + 2, final, [True] * B, n, hidden, new)
    spec.settle(rows, n, accepted, last_node, batch.depth)
    if propose_tree:
        drafts = draft_tree(runner, batch, n_host, [len(r.draft_token_ids) for r in reqs], new)
    else:
        drafts = runner.speculator.propose(cache, batch)
    final = torch.minimum(final, drafts.num_final)
    t2 = runner._now()
    runner._decode_results(decodes, results, emitted, accepted, final, drafts,
                           SimpleNamespace(batch=B, window=D + 1), gaps, lps)
    for r, rank in zip(reqs, ranks.gather(1, last_node[:, None])[:, 0].tolist()):
        results[r.index].leaf_rank = rank             # > 0: the accepted path ended in a leaf
    return runner._now() - t0 - (t2 - t1), t2 - t1
