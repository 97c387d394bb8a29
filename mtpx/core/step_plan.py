"""What the scheduler and the draft-length policy (mtpx/auto_k) exchange once per step: the
scheduler shows the policy a `StepView` and gets a `StepPlan` (`policy.plan`), and after the step
hands it a `StepRecord` (`policy.observe`). Plain data, no tensors."""
from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["Candidate", "StepView", "StepPlan", "Round", "StepRecord", "num_new_drafts"]


def num_new_drafts(k: int, depth: int) -> int:
    """The drafts a request of draft depth `depth` proposes in a step of k: min(k, depth), the one
    place this rule lives (its modules beyond its depth never run for it)."""
    return min(k, depth)


@dataclass(frozen=True)
class Candidate:
    """A waiting request the step may admit, in queue order: first: it was never admitted (its
    depth is decided now, else it keeps `depth`); prompt_tokens, max_tokens: its known tokens and
    output limit (its module prefill, spread over its output, weighs its depth)."""

    first: bool
    depth: int
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class StepView:
    """One step as the policy sees it before deciding, after the running requests were scheduled.

    expected_batch: requests running and waiting, at most max_num_seqs (what a depth is decided
    for); depth_per_request: each request has its own depth (multi-module MTP with automatic k),
    else every one max_k; running_depths: the running requests' depths, in admission order;
    decodes: (key, drafts held) of each decode, in schedule order (a per-request allocation gives
    each at most its drafts); waiting: the candidates to admit, in order; admit(depth, freed):
    the scheduler admits the first waiting request not yet admitted at `depth` with `freed` more
    tokens of budget (the verification an allocation gave back), True when it did (False: the
    admission ends there); removed: keys of the requests that left the engine since the last
    step (their own estimates are forgotten)."""

    expected_batch: int
    depth_per_request: bool
    running_depths: tuple[int, ...]
    decodes: tuple[tuple[Hashable, int], ...]
    waiting: tuple[Candidate, ...]
    admit: Callable[[int, int], bool]
    removed: tuple[Hashable, ...] = ()


@dataclass(frozen=True)
class StepPlan:
    """The policy's decisions for one step: k, the drafts every request proposes (each request
    `num_new_drafts(k, its depth)`); admitted: the depths of the requests admitted, in order;
    lowered: (depth, new depth) for running depths that fall (every running request at depth
    takes new depth; its later blocks are keyed on it); num_verified: the drafts each decode
    verifies (a per-request allocation, in StepView.decodes' order; None: all it holds);
    allocation: the allocation those came from (request_k.Allocation; None: none); tree: every
    request proposes the engine's leaf tree of k nodes instead of a chain (tree_choice.py)."""

    k: int
    admitted: tuple[int, ...] = ()
    lowered: tuple[tuple[int, int], ...] = ()
    num_verified: tuple[int, ...] | None = None
    allocation: object | None = None
    tree: bool = False

    def num_new_drafts(self, depth: int) -> int:
        """The drafts a request at `depth` proposes this step (a tree step: the tree's k nodes)."""
        return self.k if self.tree else num_new_drafts(self.k, depth)


@dataclass(frozen=True)
class Round:
    """One decode's verification: key; verified: drafts scheduled for verification; held: drafts
    it held before the step; depth: its draft depth; age: its output tokens before the round;
    num_draft_tokens, num_accepted: the runner's drafts verified and raw accepted count;
    num_tokens: tokens the round produced; leaf_rank: a tree round whose accepted path ended in a
    leaf, the leaf's sibling rank (else 0)."""

    key: Hashable
    verified: int
    held: int
    depth: int
    age: int
    num_draft_tokens: int
    num_accepted: int
    num_tokens: int
    leaf_rank: int = 0


@dataclass(frozen=True)
class StepRecord:
    """A finished step, for the policy to learn from: k (StepPlan.k); has_prefills: a prefill
    chunk ran in it; rounds: one per decode, in schedule order; timed: the runner recorded the
    step's timing (StepTiming; else the seconds below are 0 and nothing is learned from them);
    verify_s, draft_s: the decodes' verification and draft round; prefill_module_tokens,
    prefill_draft_s: the speculator's part of the prefill (prompt tokens x modules run over them,
    seconds); wall_s: the step's wall time, from schedule() to the end of update_from_output (its
    overhead beyond the forwards is wall_s - verify_s - draft_s - catch_up_s); catch_up_module_tokens,
    catch_up_s: the decode step's lazy catch-up of modules that fell behind in steps without drafts
    (positions x modules, seconds)."""

    k: int
    has_prefills: bool
    rounds: tuple[Round, ...]
    timed: bool = False
    verify_s: float = 0.0
    draft_s: float = 0.0
    prefill_module_tokens: int = 0
    prefill_draft_s: float = 0.0
    wall_s: float = 0.0
    catch_up_module_tokens: int = 0
    catch_up_s: float = 0.0
