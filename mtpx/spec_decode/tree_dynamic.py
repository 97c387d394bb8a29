"""EAGLE-2's dynamic draft tree over MTP drafts (DynamicTree, mtpx/spec_decode/tree.py; Li et al.
2024, arXiv 2406.16858; SGLang's `--speculative-eagle-topk` / `--speculative-num-draft-tokens`).

A round's state (`new_round`) holds the expanded nodes at offsets 0 (the root) .. topk * (depth - 1):
tok, par (parent offset, -1 at the root), anc (ancestors and itself, the root left out: its module
KV is committed), score (cumulative draft log-probability, float32) and cand (the candidate index of
each). `expand` turns the draft logits of one level's frontier into its topk children per node
(candidates, score = parent's + log p) and, below the last depth, picks the next frontier: the topk
candidates of highest score. `select` keeps the num_draft_tokens candidates of highest score: a
node's score never exceeds its parent's and ties keep the earlier (the parent) first, so they form a
tree; listed by candidate index, it is breadth first.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from mtpx.spec_decode.tree import DynamicTree


def new_round(tree: DynamicTree, B: int, device) -> SimpleNamespace:
    """The state of one round for B rows (module doc)."""
    E = tree.num_expanded
    par = torch.zeros(B, E + 1, dtype=torch.long, device=device)
    par[:, 0] = -1
    return SimpleNamespace(tok=torch.zeros(B, E + 1, dtype=torch.long, device=device), par=par,
                           anc=torch.zeros(B, E + 1, E + 1, dtype=torch.bool, device=device),
                           score=torch.zeros(B, E + 1, device=device),
                           cand=torch.zeros(B, E + 1, dtype=torch.long, device=device), cands=[])


def frontier(tree: DynamicTree, level: int) -> list[int]:
    """The offsets of the nodes whose children `level` drafts: [0] (the root) at level 1, else the
    level - 1 frontier."""
    K = tree.topk
    return [0] if level == 1 else list(range((level - 2) * K + 1, (level - 1) * K + 1))


def expand(g: SimpleNamespace, tree: DynamicTree, level: int, logits: torch.Tensor) -> None:
    """logits [B, P, V]: the draft logits at the `frontier(tree, level)` nodes -> level's
    candidates, and (level < depth) its frontier at offsets (level - 1) * topk + 1 .. (module doc)."""
    K, dev = tree.topk, logits.device
    par_off = frontier(tree, level)
    val, ids = torch.log_softmax(logits.float(), -1).topk(K, -1)                 # [B, P, K]
    score = (g.score[:, par_off][:, :, None] + val.clamp(max=0)).flatten(1)      # [B, P * K]
    tok = ids.flatten(1)
    off = torch.tensor(par_off, device=dev).repeat_interleave(K)                 # parent offset
    first = sum(c[0].shape[1] for c in g.cands)
    g.cands.append((tok, score, off, torch.arange(K, device=dev).repeat(len(par_off))))
    if level == tree.depth:
        return
    s, j = score.topk(K, -1)                                                      # [B, K]
    offs = torch.arange((level - 1) * K + 1, level * K + 1, device=dev)
    parent = off[j]
    g.tok[:, offs], g.score[:, offs], g.par[:, offs], g.cand[:, offs] = tok.gather(1, j), s, parent, first + j
    anc = g.anc.gather(1, parent[..., None].expand(-1, -1, g.anc.shape[-1])).clone()   # [B, K, E + 1]
    anc[:, torch.arange(K, device=dev), offs] = True
    g.anc[:, offs] = anc


def select(g: SimpleNamespace, tree: DynamicTree):
    """The num_draft_tokens best candidates (module doc) -> (tokens [B, N]; parents, depths,
    ranks [B, N + 1] int64, node 0 the root: parent -1, depth 0, rank 0)."""
    tok = torch.cat([c[0] for c in g.cands], 1)
    score = torch.cat([c[1] for c in g.cands], 1)
    B, dev, N = tok.shape[0], tok.device, tree.num_draft_tokens
    depth = torch.cat([torch.full((c[0].shape[1],), d + 1, device=dev) for d, c in enumerate(g.cands)])
    rank = torch.cat([c[3] for c in g.cands])
    pc = torch.cat([torch.full_like(g.cands[0][0], -1)] + [g.cand[:, c[2]] for c in g.cands[1:]], 1)
    sel = torch.sort(score, stable=True, dim=1, descending=True).indices[:, :N].sort(1).values   # [B, N]
    pos = torch.full_like(tok, -1)
    pos.scatter_(1, sel, torch.arange(1, N + 1, device=dev).expand(B, N).contiguous())
    p = pc.gather(1, sel)
    parents = torch.where(p < 0, 0, pos.gather(1, p.clamp(min=0)))
    root = torch.zeros(B, 1, dtype=torch.long, device=dev)
    return (tok.gather(1, sel), torch.cat([root - 1, parents], 1), torch.cat([root, depth[sel]], 1),
            torch.cat([root, rank[sel]], 1))
