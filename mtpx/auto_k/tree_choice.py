"""The automatic choice between chain and tree (`spec.num_speculative_tokens=auto` with a static
leaf `spec.tree`, docs/trees.md): every step runs automatic k's chain (its k in 0 .. max_k,
AutoDraftLength) or the configured leaf tree (N nodes, depth D), whichever has the higher
predicted goodput at the step's batch size B. Scheduler side, as policy.py: no torch, no I/O.

    goodput(chain, B) = max_k' B * E[tokens | k'] / t(k', B)       (AutoDraftLength.goodput)
    goodput(tree, B)  = B * E_tree / t_tree(B)
    E_tree = E[tokens | D] + sum_{c < D} p_1 .. p_c (1 - p_{c+1}) q_c

A leaf tree is the chain of D first choices plus sibling leaves (mtpx/spec_decode/tree_leaves.py):
its chain part is a chain of D drafts, token for token, and accepts exactly what that chain
accepts; the tree gains one token when the chain part stops after c drafts and a leaf at depth
c + 1 is the target's token: q_c, the share of tree rounds stopped after c whose path ended in a
leaf (discounted counts, prior `prior_leaf` of weight prior_weight; counted per depth and per rank,
`rank_counts`). The p_j are automatic k's, which tree rounds teach too (their chain part).
t_tree(B): the running median of the tree steps' ms (verification and draft round) in B's bucket,
plus automatic k's learned step overhead; in a bucket not measured yet, the prior
t(D, B) (N + 1) / (D + 1) (a verified node costs about what a chain token costs: experiments/trees)
times the median ratio measured / prior of the buckets measured.

A step whose requests' draft depths (multi-module MTP: the modules a request runs, which only
fall, policy.py) are not all at least D runs the chain. Switching: the tree is chosen when its
goodput beats the best chain's by the hysteresis in `patience` decisions in a row, and left the
same way. Exploring: while the tree is unlearned in B's
bucket (fewer than `min_rounds` rounds, or no cost sample) or `refresh` steps after its last
exploration, it runs `burst` steps in a row, while the steps explored stay at most `explore_share`
of the steps planned. So a tree that does not pay costs at most explore_share of the steps at its
own speed (5% of steps at 0.85x the chain: 0.8% of the throughput).
"""
from __future__ import annotations

import dataclasses
from statistics import median

from mtpx.auto_k.cost_curve import running_median
from mtpx.auto_k.cost_model_log import batch_bucket
from mtpx.auto_k.policy import AutoDraftLength
from mtpx.core.step_plan import StepPlan, StepRecord, StepView


@dataclasses.dataclass(frozen=True)
class LeafTree:
    """What the choice needs of a leaf tree (TreeShape.is_leaf_tree): num_nodes N, depth D,
    chain_depth[n]: the chain drafts among its first n nodes (breadth first), leaf_depths: the
    depths (1-based) that have leaves."""

    num_nodes: int
    depth: int
    chain_depth: tuple[int, ...]
    leaf_depths: frozenset[int]

    @classmethod
    def of(cls, paths) -> LeafTree:
        """From a leaf tree's paths (sibling ranks per depth, breadth first)."""
        paths = [tuple(p) for p in paths]
        chain = [max([0] + [len(p) for p in paths[:i] if not any(p)]) for i in range(len(paths) + 1)]
        return cls(len(paths), max(len(p) for p in paths), tuple(chain),
                   frozenset(len(p) for p in paths if p[-1] > 0))


class AutoChainOrTree(AutoDraftLength):
    """AutoDraftLength that also chooses, per step, the leaf tree `tree` (a LeafTree) instead of the
    chain (module doc). A tree step's StepPlan has tree=True and k = N (every request proposes the
    tree). forced_tree(step) -> bool, when set, decides every step (tests drive the switches).
    The choice's knobs: explore_share, burst, refresh, min_rounds, prior_leaf (module doc)."""

    def __init__(self, max_k: int, tree: LeafTree, *args, explore_share: float = 0.05, burst: int = 3,
                 refresh: int = 200, min_rounds: int = 16, prior_leaf: float = 0.05, **kwargs):
        if tree.depth > max_k:
            raise ValueError(f"a leaf tree {tree.depth} deep beyond automatic k's {max_k} drafts")
        self.tree, self.explore_share, self.burst, self.refresh = tree, explore_share, burst, refresh
        self.min_rounds, self.prior_leaf = min_rounds, prior_leaf
        self.forced_tree = None
        super().__init__(max_k, *args, **kwargs)

    def reset(self) -> None:
        """AutoDraftLength.reset, and the tree's counts, costs and switching state."""
        super().reset()
        D = self.tree.depth
        self.stops, self.hits = [0.0] * D, [0.0] * D      # tree rounds stopped after c chain drafts; leaf won
        self.rank_counts = [[0] * 1 for _ in range(D)]    # [depth - 1][rank]: accepted leaves (rank 0 unused)
        self.tree_rounds = 0
        self.tree_ms: dict = {}                           # batch bucket -> RunningMedian of tree steps' ms
        self.tree_mode, self._tree_streak = False, 0
        self._planned_steps = self._explored_steps = self.tree_steps = 0
        self._last_explored, self._burst_left = 0, 0
        self._forms = (False, False)       # (the previous step proposed a tree, this step does)
        self._chain_k = 0                  # the chain's k of this step (what automatic k decided)

    # ---- estimates -------------------------------------------------------------------------------
    def leaf_rate(self, c: int) -> float:
        """q_c: P(a leaf at depth c + 1 wins | the chain part stopped after c drafts)."""
        if c + 1 not in self.tree.leaf_depths:
            return 0.0
        w = self.prior_weight
        return (self.hits[c] + self.prior_leaf * w) / (self.stops[c] + w)

    def tree_tokens(self) -> float:
        """E_tree: tokens per request and tree step (module doc), from the engine-wide p_j."""
        p, reach, gain = self.acceptance, 1.0, 0.0
        for c in range(self.tree.depth):
            gain += reach * (1 - p[c]) * self.leaf_rate(c)
            reach *= p[c]
        return self.expected_tokens(self.tree.depth) + gain

    def tree_cost(self, batch_size: int) -> float:
        """t_tree(B) in ms, the learned overhead included (module doc)."""
        D, N = self.tree.depth, self.tree.num_nodes

        def prior(b: int) -> float:
            return self.costs.cost_curve(b)[D] * (N + 1) / (D + 1)
        overhead = self.costs.step_cost_curve(batch_size)[0] - self.costs.cost_curve(batch_size)[0]
        bucket = batch_bucket(batch_size)
        if bucket in self.tree_ms:
            return self.tree_ms[bucket].value + overhead
        ratios = [m.value / prior(b) for b, m in self.tree_ms.items()]
        return prior(batch_size) * (median(ratios) if ratios else 1.0) + overhead

    def tree_goodput(self, batch_size: int) -> float:
        return batch_size * self.tree_tokens() / self.tree_cost(batch_size)

    def _unlearned(self, batch_size: int) -> bool:
        return self.tree_rounds < self.min_rounds or batch_bucket(batch_size) not in self.tree_ms

    # ---- the step ----------------------------------------------------------------------------------
    def plan(self, view: StepView) -> StepPlan:
        """AutoDraftLength.plan (admissions, depths, the chain's k), then chain or tree (module doc)."""
        plan = super().plan(view)
        self._chain_k = plan.k
        self._planned_steps += 1
        lowered = dict(plan.lowered)      # a request's draft depth (multi-module MTP) below D: no tree
        depths = [lowered.get(d, d) for d in view.running_depths] + list(plan.admitted)
        tree = min(depths, default=self.max_k) >= self.tree.depth and self._choose(len(depths))
        self._forms = (self._forms[1], tree)
        if not tree:
            return plan
        self.tree_steps += 1
        return dataclasses.replace(plan, k=self.tree.num_nodes, tree=True)

    def _choose(self, batch_size: int) -> bool:
        """Whether this step proposes the tree (a decision applied: it counts streaks and exploring)."""
        if self.forced_tree is not None:
            return bool(self.forced_tree(self._planned_steps))
        if self.step_costs is None or self.forced is not None or batch_size < 1:
            return False
        g_chain = max(self.goodput(k, batch_size) for k in range(self.max_k + 1))
        wins = self.tree_goodput(batch_size) > (1 + self.hysteresis) * g_chain
        self._tree_streak = self._tree_streak + 1 if wins != self.tree_mode else 0
        if self._tree_streak >= self.patience:
            self.tree_mode, self._tree_streak = wins, 0
        if self.tree_mode:
            return True
        if self._burst_left > 0:
            self._burst_left -= 1
            self._explored_steps += 1
            return True
        due = self._unlearned(batch_size) or self._planned_steps - self._last_explored >= self.refresh
        if due and self._explored_steps + self.burst <= self.explore_share * self._planned_steps:
            self._burst_left, self._last_explored = self.burst - 1, self._planned_steps
            self._explored_steps += 1
            return True
        return False

    def observe(self, record: StepRecord) -> None:
        """AutoDraftLength.observe with the chain's k, from what a chain round of the same drafts
        would show: a tree round's chain part (its chain drafts verified, the accepted ones before a
        leaf); the leaf counts and a steady tree step's cost (it verified a tree and proposed one)
        are the tree's own. A step that switches teaches no step cost."""
        verified_tree, proposed_tree = self._forms
        steady = verified_tree == proposed_tree
        if verified_tree:
            rounds = tuple(self._chain_part(r) for r in record.rounds)
            if steady and record.timed and not record.has_prefills and rounds:
                ms = 1e3 * (record.verify_s + record.draft_s)
                running_median(self.tree_ms, batch_bucket(len(rounds)), ms, self.cost_window)
            record = dataclasses.replace(record, rounds=rounds)
        super().observe(dataclasses.replace(record, k=self._chain_k, timed=record.timed and steady
                                            and not verified_tree))

    def _chain_part(self, r):
        """A tree round's Round as its chain part's (module doc); its leaf counted."""
        if not r.num_draft_tokens:
            return r
        chain = self.tree.chain_depth[min(r.num_draft_tokens, self.tree.num_nodes)]
        leaf = r.leaf_rank > 0
        c = r.num_accepted - leaf
        self.tree_rounds += 1
        self.stops = [x * self.decay for x in self.stops]
        self.hits = [x * self.decay for x in self.hits]
        if c < chain:
            self.stops[c] += 1
            if leaf:
                self.hits[c] += 1
                row = self.rank_counts[c]
                row += [0] * (r.leaf_rank + 1 - len(row))
                row[r.leaf_rank] += 1
        return dataclasses.replace(r, verified=chain, held=chain, num_draft_tokens=chain, num_accepted=c)

    def summary(self) -> dict:
        """metrics.json's auto_k (AutoDraftLength.summary) with "tree_choice": steps that proposed
        the tree (exploring ones apart), tree rounds, E_tree and q_c now, the leaves accepted per
        depth and rank, and the tree steps' median ms per batch bucket."""
        out = super().summary()
        out["tree_choice"] = {
            "tree_steps": self.tree_steps, "explored_steps": self._explored_steps,
            "planned_steps": self._planned_steps, "tree_rounds": self.tree_rounds,
            "tree_tokens": self.tree_tokens(),
            "leaf_rate": [self.leaf_rate(c) for c in range(self.tree.depth)],
            "accepted_leaf_rank_per_depth": self.rank_counts,
            "tree_step_ms": {b: m.value for b, m in sorted(self.tree_ms.items())}}
        return out
