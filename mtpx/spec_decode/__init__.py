from mtpx.spec_decode.multi_module import MultiModuleMTPSpeculator
from mtpx.spec_decode.single_module import SingleModuleMTPSpeculator
from mtpx.spec_decode.tree import DynamicTree, build_tree_shape
from mtpx.spec_decode.tree_draft import TreeSpeculator
from mtpx.spec_decode.tree_leaves import leaf_tree_speculator

SPECULATORS = {"mtp1": SingleModuleMTPSpeculator, "mtp8": MultiModuleMTPSpeculator}


def build_speculator(method: str | None, model, num_speculative_tokens: int | None, tree=None):
    """method: None (plain decoding), "mtp1" (single-module) or "mtp8" (multi-module);
    num_speculative_tokens 0 is plain decoding too (so a sweep over k can include it). tree: a
    `spec.tree` value (mtpx/spec_decode/tree.py): a TreeSpeculator, or for a chain ([1] * k) the
    chain speculator with k = its depth; num_speculative_tokens must then be None or the tree's
    depth. Raises ValueError naming the choices for an unknown method, or the key of a bad tree."""
    if method is None or (num_speculative_tokens == 0 and not isinstance(num_speculative_tokens, bool)):
        return None
    if method not in SPECULATORS:
        raise ValueError(f"unknown spec '{method}': choose one of {sorted(SPECULATORS)} (+spec=NAME) "
                         "or no spec for plain decoding")
    if tree is not None:
        return _tree_speculator(method, model, num_speculative_tokens, tree)
    return SPECULATORS[method](model, num_speculative_tokens)


def _tree_speculator(method: str, model, num_speculative_tokens, tree):
    shape = build_tree_shape(tree, len(model.mtp) if method == "mtp8" else None)
    depth = len(list(tree)) if shape is None else shape.depth
    if num_speculative_tokens is not None and num_speculative_tokens != depth:
        raise ValueError(f"spec.num_speculative_tokens={num_speculative_tokens} with a spec.tree {depth} "
                         "deep: leave spec.num_speculative_tokens null (the tree sets the drafts)")
    if shape is None or getattr(shape, "topk", 0) == 1:     # a chain: the chain speculator, exactly
        return SPECULATORS[method](model, depth)
    if len(model.mtp) < 1:
        raise ValueError("the model has no MTP module (num_nextn_predict_layers=0): "
                         "train some with mode=train or run without +spec")
    if isinstance(shape, DynamicTree):
        return TreeSpeculator(model, shape, multi=method == "mtp8")
    return leaf_tree_speculator(model, shape, multi=method == "mtp8")


__all__ = ["MultiModuleMTPSpeculator", "SingleModuleMTPSpeculator", "build_speculator", "SPECULATORS"]
