"""The gated delta rule over a tree of tokens in one C call (mtpx/kernels/gdn_tree.c `gdn_tree`):
mtpx.models.tree_forward.tree_delta_rule's contract, node after node from the parent's state,
where the reference loops over the tree's depths in Python. Float32 CPU tensors without
gradients (`runs`); under torch.compile the custom op `mtpx::gdn_tree`.
"""
from __future__ import annotations

import ctypes

import torch

from mtpx.kernels import build, torch_ops

use_kernel = True
_fn = None


def available() -> bool:
    """Whether the kernel is built and loaded (builds it on the first call)."""
    global _fn
    if _fn is None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        _fn = build.function("gdn_tree", [p] * 9 + [i64] * 6)
    return _fn is not None


def runs(q: torch.Tensor, initial_state: torch.Tensor) -> bool:
    """Whether `tree` runs: float32 CPU tensors without gradients, a built kernel (loaded already,
    under torch.compile)."""
    ready = build.loaded() if torch.compiler.is_compiling() else available()
    return (use_kernel and q.device.type == "cpu" and q.dtype == torch.float32
            and initial_state.dtype == torch.float32 and not torch.is_grad_enabled() and ready)


def tree(q, k, v, g, beta, initial_state, parents):
    """q, k [B, T, H, Dk] (before the l2 norm); v [B, T, H, Dv]; g, beta [B, T, H]; initial_state
    [B, H, Dk, Dv]; parents [B, T] int64 (-1 at the root) -> (o [B, T, H, Dv], ssm
    [B, T, H, Dk, Dv], the state after each node)."""
    fn = torch.ops.mtpx.gdn_tree if torch.compiler.is_compiling() else _gdn_tree
    return fn(q, k, v, g, beta, initial_state, parents)


def _gdn_tree(q, k, v, g, beta, S0, parents):
    if _fn is None and not available():
        raise RuntimeError("mtpx gdn_tree: the CPU kernels are not built")
    q, k, v, g, beta, S0, parents = (t.contiguous() for t in (q, k, v, g, beta, S0, parents))
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    o, ssm = q.new_empty(B, T, H, dv), q.new_empty(B, T, H, dk, dv)
    _fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), S0.data_ptr(),
        parents.data_ptr(), o.data_ptr(), ssm.data_ptr(), B, T, H, dk, dv, torch.get_num_threads())
    return o, ssm


def _gdn_tree_fake(q, k, v, g, beta, S0, parents):
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    return q.new_empty(B, T, H, dv), q.new_empty(B, T, H, dk, dv)


torch_ops.define("gdn_tree(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor S0, Tensor parents) "
                 "-> (Tensor, Tensor)", _gdn_tree, _gdn_tree_fake)
