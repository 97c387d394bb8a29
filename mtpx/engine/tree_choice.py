"""The automatic choice between chain and tree, the model runner's side (docs/trees.md): with
`spec.num_speculative_tokens=auto` and a leaf `spec.tree`, the policy (mtpx/auto_k/tree_choice.py)
gives each step to automatic k's chain or to the tree (SchedulerOutput.tree); the runner's
speculator is the chain's, and the tree's (a LeafTreeSpeculator) runs the same chain round plus
the leaves (mtpx/spec_decode/tree_leaves.py), so both keep one module state.

A step verifies what its requests hold: the trees proposed in a tree step go through tree
verification (mtpx/engine/tree_step.py), chains through the chain's; and it proposes what the policy
chose: a chain verification followed by the tree's round, or a tree verification followed by the
chain's (eager, compiled or not: switching steps are few). Under engine.compile the chain steps
run automatic k's graphs and the tree steps the tree's two (mtpx/engine/compiled_tree.py), which
the warm-up builds on a forced schedule (mtpx/engine/warmup.py). A request holding the other form
than the step verifies (it was not scheduled in the step that proposed the others') verifies none
of its drafts.

    choice_policy(method, model, max_k, tree) -> AutoChainOrTree (ValueError, one line, for a tree
                                                 the choice does not support)
    leaf_tree_over(chain, tree, model) -> the LeafTreeSpeculator sharing `chain`'s round
    verify_with(config, k, tree_speculator) -> (the chain steps' verification method, lossy rule)

Seeds: with spec.verify=standard, the chain steps verify with one uniform per output position
(verify_by_position in mtpx/spec_decode/verification.py), as tree steps do, so a seeded request's
output is plain seeded sampling's whichever form each step ran.
"""
from __future__ import annotations

import dataclasses

import torch

from mtpx.auto_k.tree_choice import AutoChainOrTree, LeafTree
from mtpx.spec_decode.acceptance import build_rule
from mtpx.spec_decode.multi_module import MultiModuleMTPSpeculator
from mtpx.spec_decode.protocol import Drafts
from mtpx.spec_decode.tree import DynamicTree, build_tree_shape
from mtpx.spec_decode.tree_leaves import LeafTreeSpeculator

_KEY = "spec.tree with spec.num_speculative_tokens=auto"


def _leaf_shape(method: str, model, max_k: int, tree):
    """The TreeShape of `tree` when the automatic choice supports it, else ValueError (one line):
    a static leaf tree, at most max_k deep, and with multi-module MTP exactly max_k deep (every
    module runs in every step, chain or tree)."""
    shape = build_tree_shape(tree, len(model.mtp) if method == "mtp8" else None)
    leaf = shape is not None and not isinstance(shape, DynamicTree) and shape.is_leaf_tree
    if not leaf or shape.num_nodes == shape.depth:
        raise ValueError(f"{_KEY}: give a leaf tree, the chain of first choices plus sibling leaves "
                         "(e.g. [[0], [1], [0, 0], [0, 0, 0]] or [1, 1, 3]), or a fixed "
                         "spec.num_speculative_tokens")
    if shape.depth > max_k or (method == "mtp8" and shape.depth != max_k):
        need = f"exactly {max_k}" if method == "mtp8" else f"at most {max_k}"
        raise ValueError(f"{_KEY}: the leaf tree is {shape.depth} deep; with {method} it must be {need} "
                         "deep (automatic k's drafts)")
    return shape


def choice_policy(method: str, model, max_k: int, tree) -> AutoChainOrTree:
    """The policy choosing between automatic k's chain over 0 .. max_k and the leaf tree `tree`
    (a spec.tree value)."""
    return AutoChainOrTree(max_k, LeafTree.of(_leaf_shape(method, model, max_k, tree).paths))


def leaf_tree_over(chain, tree, model) -> LeafTreeSpeculator:
    """The LeafTreeSpeculator of `tree` (a spec.tree value) whose round is the chain speculator
    `chain`'s (mtp8's MultiModuleMTPSpeculator or mtp1's SingleModuleMTPSpeculator)."""
    method = "mtp8" if isinstance(chain, MultiModuleMTPSpeculator) else "mtp1"
    shape = _leaf_shape(method, model, chain.num_speculative_tokens, tree)
    return LeafTreeSpeculator(model, shape, method == "mtp8", base=chain)


def verify_with(config, k: int, tree_speculator) -> tuple[str, object]:
    """(config.verify, or "position" for the choice's chain steps with spec.verify=standard; the
    lossy acceptance rule of k drafts or None: mtpx/spec_decode/acceptance.py build_rule)."""
    chain_as_tree = tree_speculator is not None and config.verify == "standard"
    return ("position" if chain_as_tree else config.verify), build_rule(config, k)


class TreeChoice:
    """The runner's state of the choice: `spec` (the tree's LeafTreeSpeculator, allocated here on
    the engine's ModelCache `cache` after the chain speculator) and `held`, the request indices
    whose drafts are a tree (proposed in a tree step)."""

    def __init__(self, spec: LeafTreeSpeculator, cache):
        spec.allocate(cache)                # its round is the chain speculator's: no state of its own
        self.spec, self.held = spec, set()

    def split(self, decodes: list) -> tuple[bool, list]:
        """(whether the step verifies trees: a decode holds a tree to verify, the decodes, those
        holding the other form verifying none of their drafts)."""
        tree = any(d.num_draft_tokens and d.request.index in self.held for d in decodes)
        return tree, [d if not d.num_draft_tokens or (d.request.index in self.held) == tree
                      else dataclasses.replace(d, num_draft_tokens=0) for d in decodes]

    def proposed(self, items: list, tree: bool) -> None:
        """After a step: the scheduled requests that proposed drafts hold a tree when `tree`."""
        for item in items:
            if item.num_new_drafts and tree:
                self.held.add(item.request.index)
            else:
                self.held.discard(item.request.index)

    def release(self, index) -> None:
        self.held.discard(index)

    def propose(self, runner, reqs: list, rows: torch.Tensor, num_tokens: torch.Tensor, final: torch.Tensor,
                target_start: torch.Tensor, hidden: torch.Tensor, new: list[int]) -> Drafts:
        """The tree's round after a chain verification (ModelRunner._decode's values of the B
        requests: rows, known tokens, final positions, x_n's positions, the window's hidden states
        [B, T, hidden]; new: the nodes each proposes), eager."""
        B = len(reqs)
        batch = runner._draft_batch(reqs, rows[:B], num_tokens, final, [True] * B, target_start[:B],
                                    hidden[:B], new)
        return self.spec.propose(runner.cache, batch)
