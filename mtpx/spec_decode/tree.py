"""Tree shapes for tree drafting (`spec.tree`) and the tree algebra of one verification round.

A tree of drafts hangs below the root, the last known token x_n. Node i (1..N) holds one draft
token; its parent is the root (index 0) or an earlier node, so the nodes are listed breadth first
(by depth, then by path) and any prefix of the list is a tree too. A node is named by its path of
sibling ranks, as Medusa's and EAGLE's "choices": (0,) is the draft's best token at depth 1, (1,)
its second best, (0, 1) the second best child of (0,), ... (Cai et al. 2024, arXiv 2401.10774;
Li et al. 2024, arXiv 2401.15077).

`spec.tree` takes:

- a list of widths, top-k children per depth: [3, 2, 1] is every path whose rank at depth d is
  below widths[d] (3 + 6 + 6 = 15 nodes);
- a list of paths (choices): [[0], [1], [0, 0], [0, 0, 0]], every path's parent path listed too.

A chain of k drafts is [1] * k: the plain chain speculator runs it (`build_tree_shape` returns
None for it), so a chain is exactly today's behaviour.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeShape:
    """A static tree: paths[i - 1] is node i's path of sibling ranks (breadth first).

    parents[i]: node i's parent index (-1 for the root, i = 0); depths[i]: its depth (root 0);
    ranks[i]: its rank among its siblings (root 0); widths[d - 1]: the most children a depth-(d-1)
    node has (the top-k each depth draws)."""

    paths: tuple[tuple[int, ...], ...]

    @property
    def num_nodes(self) -> int:
        """Draft tokens N (nodes besides the root)."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def parents(self) -> list[int]:
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return [-1] + [index.get(p[:-1], 0) for p in self.paths]

    @property
    def depths(self) -> list[int]:
        return [0] + [len(p) for p in self.paths]

    @property
    def ranks(self) -> list[int]:
        return [0] + [p[-1] for p in self.paths]

    @property
    def widths(self) -> list[int]:
        return [1 + max(p[-1] for p in self.paths if len(p) == d) for d in range(1, self.depth + 1)]

    @property
    def is_chain(self) -> bool:
        return all(w == 1 for w in self.widths)

    @property
    def is_leaf_tree(self) -> bool:
        """The chain of first choices plus leaves: every node of rank > 0 has no children (each
        path's ranks are 0 but for the last), so the chain speculator drafts it
        (mtpx/spec_decode/tree_leaves.py)."""
        return all(not any(p[:-1]) for p in self.paths)

    def tensors(self, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(parents, depths, ranks), each [N + 1] int64."""
        return tuple(torch.tensor(x, dtype=torch.long, device=device)
                     for x in (self.parents, self.depths, self.ranks))


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _paths_from_widths(widths: list[int]) -> list[tuple[int, ...]]:
    paths, level = [], [()]
    for w in widths:
        level = [p + (r,) for p in level for r in range(w)]
        paths += level
    return paths


def plain_tree(value):
    """A spec.tree value as plain nested lists and dicts (an OmegaConf ListConfig, tuples: lists)."""
    if hasattr(value, "keys"):
        return {k: plain_tree(value[k]) for k in value}
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        return value
    return [plain_tree(x) for x in value]


def build_tree_shape(value, num_draft_modules: int | None = None,
                     key: str = "spec.tree") -> TreeShape | DynamicTree | None:
    """The TreeShape of a `spec.tree` value (module doc), its DynamicTree for the dynamic form (a
    mapping), or None for None and for a chain ([1] * k: the chain speculator).
    num_draft_modules: multi-module MTP's module count (a tree
    may be at most that deep), None for single-module MTP. Raises ValueError, one line naming
    `key` and the fix, for a zero or negative width, a path without its parent path, repeated
    paths, a tree deeper than the modules, or a value of another type."""
    if value is None:
        return None
    if hasattr(value, "keys"):
        check_dynamic_tree(dict(value), num_draft_modules, key)
        return DynamicTree(int(value["num_draft_tokens"]), int(value["depth"]), int(value["topk"]))
    items = list(value) if isinstance(value, (list, tuple)) or hasattr(value, "__iter__") else None
    if isinstance(value, (str, dict)) or not items:
        raise ValueError(f"{key}={value!r}: give a list of widths per depth, e.g. [3, 2, 1], or a list "
                         "of paths, e.g. [[0], [1], [0, 0]]")
    if all(_is_int(w) for w in items):
        if any(w < 1 for w in items):
            raise ValueError(f"{key}={list(items)}: every width must be >= 1 (top-k children per depth)")
        paths = _paths_from_widths([int(w) for w in items])
    else:
        paths = []
        for p in items:
            p = list(p) if not isinstance(p, (str, dict)) and hasattr(p, "__iter__") else None
            if not p or not all(_is_int(r) and r >= 0 for r in p):
                raise ValueError(f"{key}: each path must be a non-empty list of ranks >= 0, got {p!r}")
            paths.append(tuple(int(r) for r in p))
        if len(set(paths)) != len(paths):
            raise ValueError(f"{key}: a path is listed twice")
        known = set(paths)
        for p in paths:
            if len(p) > 1 and p[:-1] not in known:
                raise ValueError(f"{key}: path {list(p)} has no parent path {list(p[:-1])}: list it too")
            if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in known:
                raise ValueError(f"{key}: path {list(p)} without its better-ranked sibling "
                                 f"{list(p[:-1] + (p[-1] - 1,))}: list it too")
        paths.sort(key=lambda p: (len(p), p))
    shape = TreeShape(tuple(paths))
    if num_draft_modules is not None and shape.depth > num_draft_modules:
        raise ValueError(f"{key} is {shape.depth} deep but the model has {num_draft_modules} MTP modules "
                         f"(multi-module MTP drafts depth d with module d): use at most {num_draft_modules} "
                         "depths, or +spec=mtp1")
    return None if shape.is_chain else shape


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's dynamic tree (Li et al. 2024, arXiv 2406.16858): `depth` levels; level 1 is the
    root's top-`topk` children, level d + 1 the top-`topk` children of the `topk` level-d nodes of
    highest cumulative draft log-probability (the frontier, expanded); the tree verified is the
    `num_draft_tokens` drafted nodes of highest cumulative log-probability (a node's never exceeds
    its parent's, so they form a tree). Each request gets its own tree (`rows_tree`)."""

    num_draft_tokens: int
    depth: int
    topk: int

    @property
    def num_nodes(self) -> int:
        return self.num_draft_tokens

    @property
    def num_expanded(self) -> int:
        """Frontier nodes the draft runs over (levels 1 .. depth - 1): topk * (depth - 1)."""
        return self.topk * (self.depth - 1)

    @property
    def num_candidates(self) -> int:
        """Nodes drafted before the budget's choice: topk + (depth - 1) * topk ** 2."""
        return self.topk + (self.depth - 1) * self.topk ** 2

    @property
    def paths(self) -> tuple:
        """No fixed paths (metrics.json's "tree" records them for static shapes): each round's
        tree is its own."""
        return ()


DYNAMIC_KEYS = ("num_draft_tokens", "depth", "topk")


def check_dynamic_tree(value: dict, num_draft_modules: int | None = None, key: str = "spec.tree") -> None:
    """Check spec.tree's dynamic form (EAGLE-2, arXiv 2406.16858; SGLang's names): {num_draft_tokens:
    the node budget, depth: the draft levels, topk: the children of each expanded node and the
    nodes expanded per level}. Raises ValueError, one line naming the key and the fix, for an unknown
    or missing key, a value that is not an integer >= 1, a budget smaller than the depth, or (multi-
    module MTP, num_draft_modules) a depth beyond the modules."""
    for k in value:
        if k not in DYNAMIC_KEYS:
            raise ValueError(f"{key}.{k}: unknown key; the dynamic form takes num_draft_tokens, depth, topk")
    for k in DYNAMIC_KEYS:
        if k not in value:
            raise ValueError(f"{key}.{k} is missing: the dynamic form takes num_draft_tokens, depth and topk")
        if not _is_int(value[k]) or value[k] < 1:
            raise ValueError(f"{key}.{k}={value[k]!r}: must be an integer >= 1")
    if value["num_draft_tokens"] < value["depth"]:
        raise ValueError(f"{key}.num_draft_tokens={value['num_draft_tokens']} is smaller than {key}.depth="
                         f"{value['depth']}: the budget must hold a path to the full depth")
    tree = DynamicTree(value["num_draft_tokens"], value["depth"], value["topk"])
    if tree.num_draft_tokens > tree.num_candidates:
        raise ValueError(f"{key}.num_draft_tokens={tree.num_draft_tokens} exceeds the {tree.num_candidates} "
                         f"nodes that depth {tree.depth} and topk {tree.topk} draft: lower it or raise topk")
    if tree.num_expanded > tree.num_draft_tokens:
        raise ValueError(f"{key}.num_draft_tokens={tree.num_draft_tokens} is below topk * (depth - 1) = "
                         f"{tree.num_expanded}, the nodes the draft expands (their draft KV sits in the "
                         "budget's slots): raise it or lower topk or depth")
    if num_draft_modules is not None and value["depth"] > num_draft_modules:
        raise ValueError(f"{key}.depth={value['depth']} but the model has {num_draft_modules} MTP modules "
                         f"(multi-module MTP drafts depth d with module d): use at most {num_draft_modules}, "
                         "or +spec=mtp1")


def ancestor_mask(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """parents [B, T] int64 (each node's parent index, -1 for the root, parents before
    children) -> [B, T, T] bool: mask[b, i, j] = node j is node i or one of its ancestors."""
    B, T = parents.shape
    mask = torch.eye(T, dtype=torch.bool, device=parents.device).expand(B, T, T).clone()
    cur, has = parents.clamp(min=0), parents >= 0
    for _ in range(depth):
        mask |= torch.nn.functional.one_hot(cur, T).bool() & has[..., None]
        has = has & (parents.gather(1, cur) >= 0)
        cur = parents.gather(1, cur).clamp(min=0)
    return mask


def greedy_walk(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, valid: torch.Tensor,
                target: torch.Tensor, depth: int, also: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tree verification: walk from the root along the target's argmax.

    tokens, parents, depths [B, T] int64 (node 0 the root; parents -1 there); valid [B, T] bool
    (padding nodes never match); target [B, T] int64, the target's argmax after each node; depth:
    the deepest node; also [B, T] bool or None: nodes a lossy rule accepts besides the match
    (`AcceptanceRule.tree_candidates`). A node is accepted when its token is its parent's target
    token (or `also`) and its parent is the root or accepted; the path walked ends at the deepest
    accepted node (the first in node order among equals). Lossless, siblings hold distinct tokens,
    so the accepted nodes are one path.
    Returns (accepted [B] int64, the accepted path's length m; path [B, depth + 1] int64: the node
    at each depth 0..m of the path, then the last one repeated)."""
    B, T = tokens.shape
    par = parents.clamp(min=0)
    match = tokens == target.gather(1, par)
    if also is not None:
        match = match | also
    match = match & valid & (parents >= 0)
    ok = match
    for _ in range(depth - 1):
        ok = match & ((parents == 0) | ok.gather(1, par))
    score = torch.where(ok, depths, 0)
    accepted, last = score.max(1)                              # the deepest accepted node (0: the root)
    up = [last]
    for _ in range(depth):
        up.append(par.gather(1, up[-1][:, None])[:, 0])
    up = torch.stack(up, 1)                                    # [B, depth + 1]: ancestors of `last`
    d = torch.arange(depth + 1, device=tokens.device)
    path = up.gather(1, (accepted[:, None] - d).clamp(min=0))
    return accepted, path


def depth_levels(depths: list[list[int]]) -> list[tuple[int, int]]:
    """depths [B][T] (host ints; each row's nodes breadth first) -> the [lo, hi) column ranges in
    which every row's nodes have one depth (their parents lie in earlier ranges): one range per
    depth when the rows share a shape, else as many as the rows' depths change."""
    T = len(depths[0]) if depths else 0
    levels, lo = [], 0
    for t in range(1, T + 1):
        if t == T or any(row[t] != row[lo] for row in depths):
            levels.append((lo, t))
            lo = t
    return levels
