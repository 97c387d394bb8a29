"""One decode token of a Gated DeltaNet layer on the CPU in one C call (mtpx/kernels/gdn_decode.c):
the split, the conv and its stored inputs, the gates, the l2 norms, the delta rule on the stored
state and the gated output norm, between in_proj and out_proj.

Eager, the torch ops of that span are about 40 ops and four passes over the state (their cost:
docs/engine.md, "The CPU kernels"). GatedDeltaNet.forward calls `decode` where `runs` says so and
keeps its torch ops everywhere else (prefill, verification windows, boundary states, gradients,
other dtypes, CUDA) and as the reference: `use_kernel = False` forces them. Eager, the kernel
updates the state rows in place; a whole compiled graph calls the operator mtpx::gdn_decode_,
which does the same, and a compiled layer region the functional mtpx::gdn_decode
(mtpx/kernels/torch_ops.py).
"""
from __future__ import annotations

import ctypes

import torch

from mtpx.attention.meta import ForwardMeta
from mtpx.cache.state import WindowStates, write_rows
from mtpx.kernels import build, torch_ops

use_kernel = True
_fn = _window = None


def available() -> bool:
    """Whether the kernels are built and loaded (builds them on the first call: mtpx.kernels.build)."""
    global _fn, _window
    if _fn is None or _window is None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        _fn = build.function("gdn_decode",
                             [p, i64, p, i64, p, p, p, p, p, i64, p, p, p, p, p, ctypes.c_float, p]
                             + [i64] * 7)
        _window = build.function("gdn_window", [p] * 11 + [i64] * 6)
    return _fn is not None and _window is not None


def runs(layer, qkvz: torch.Tensor, state, meta: ForwardMeta | None) -> bool:
    """Whether `decode` runs this forward: one token per request (a [B, 1] grid; packed, every
    request's token real), no per-token or boundary states kept, float32 CPU tensors without
    gradients, the torch Gated DeltaNet forms (gdn_backend not "fla"), a built kernel. Under
    torch.compile the kernel is the custom op mtpx::gdn_decode, which mutates the state rows."""
    if not use_kernel or state is None or meta is None or meta.valid.shape[1] != 1:
        return False
    if meta.keep_states or (meta.save_states is not None and state.block_ssm is not None):
        return False
    if meta.packed is not None and qkvz.shape[0] != meta.valid.shape[0]:
        return False
    tensors = (qkvz, state.conv, state.ssm, layer.conv1d.weight, layer.A_log, layer.dt_bias,
               layer.norm.weight)
    # a traced forward cannot load a library: it uses the kernel once an eager call (the engine's
    # attention backend, at start-up) has loaded mtpx's kernels
    ready = build.loaded() if torch.compiler.is_compiling() else available()
    return (meta.gdn_backend != "fla" and not torch.is_grad_enabled()
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and ready)


def decode(layer, qkvz: torch.Tensor, ba: torch.Tensor, state, meta: ForwardMeta) -> torch.Tensor:
    """qkvz [B, 1, F] or [B, F] (packed), ba likewise -> [..., nv dv] in the same leading shape, the
    input of out_proj; state.conv and state.ssm rows meta.rows updated in place (padding rows,
    meta.valid False, untouched). Raises MemoryError when the kernel's scratch cannot be allocated."""
    lead = qkvz.shape[:-1]
    B = meta.valid.shape[0]
    x, gates = qkvz.reshape(B, -1), ba.reshape(B, -1)
    x = x if x.stride(1) == 1 else x.contiguous()
    gates = gates if gates.stride(1) == 1 else gates.contiguous()
    conv, ssm = state.conv, state.ssm
    if not (conv.is_contiguous() and ssm.is_contiguous()):
        raise ValueError("the Gated DeltaNet state tensors must be contiguous")
    rows, valid = meta.rows, meta.valid.reshape(B)
    weight = layer.conv1d.weight.reshape(layer.conv_dim, layer.kernel)
    args = (x, gates, weight, conv, ssm, rows, valid, layer.A_log, layer.dt_bias, layer.norm.weight,
            layer.norm.eps, layer.nk, layer.nv)
    if torch.compiler.is_compiling() and meta.region:
        # functional in a compiled layer region (a custom op that mutates cannot sit there): the
        # new state rows come back and are written as the torch forms write them
        out, new_conv, new_ssm = torch.ops.mtpx.gdn_decode(*args)
        write_rows(conv, rows, new_conv)
        write_rows(ssm, rows, new_ssm)
    elif torch.compiler.is_compiling():
        # a whole graph: the op mutates the rows in place. Written through index_copy_, each
        # layer's state (a view of its group's stacked tensor) would be scattered back into the
        # whole stack, every layer's rows copied once per layer (6x the step's floor at batch 64)
        out = torch.ops.mtpx.gdn_decode_(*args)
    else:
        out = _gdn_decode(*args, in_place=True)[0]
    return out.view(*lead, -1)


def _gdn_decode(x, gates, weight, conv, ssm, rows, valid, A_log, dt_bias, norm_weight, eps: float, nk: int,
                nv: int, in_place: bool):
    """The kernel: (out [B, nv dv], new conv rows, new ssm rows); in_place, the new rows are written
    into conv and ssm at `rows` (padding rows untouched) and returned as None."""
    B, K = x.shape[0], weight.shape[1]
    dk, dv = ssm.shape[2], ssm.shape[3]
    if _fn is None and not available():
        raise RuntimeError("mtpx gdn_decode: the CPU kernels are not built")
    rows, valid, weight = rows.contiguous(), valid.contiguous(), weight.contiguous()
    out = torch.empty(B, nv * dv)
    conv_out, ssm_out = ((conv, ssm) if in_place
                         else (conv.new_empty(B, *conv.shape[1:]), ssm.new_empty(B, *ssm.shape[1:])))
    status = _fn(x.data_ptr(), x.stride(0), gates.data_ptr(), gates.stride(0), weight.data_ptr(),
                 conv.data_ptr(), ssm.data_ptr(), conv_out.data_ptr(), ssm_out.data_ptr(), int(not in_place),
                 rows.data_ptr(), valid.data_ptr(), A_log.data_ptr(), dt_bias.data_ptr(),
                 norm_weight.data_ptr(), eps, out.data_ptr(), B, nk, nv, dk, dv, K, torch.get_num_threads())
    if status:
        raise MemoryError("mtpx gdn_decode: out of memory for the kernel's scratch")
    return (out, None, None) if in_place else (out, conv_out, ssm_out)


def _gdn_decode_functional(x, gates, weight, conv, ssm, rows, valid, A_log, dt_bias, norm_weight, eps, nk,
                           nv):
    return _gdn_decode(x.contiguous(), gates.contiguous(), weight, conv.contiguous(), ssm.contiguous(), rows,
                       valid, A_log, dt_bias, norm_weight, eps, nk, nv, in_place=False)


def _gdn_decode_functional_fake(x, gates, weight, conv, ssm, rows, valid, A_log, dt_bias, norm_weight, eps,
                                nk, nv):
    B = x.shape[0]
    return (x.new_empty(B, nv * ssm.shape[3]), conv.new_empty(B, *conv.shape[1:]),
            ssm.new_empty(B, *ssm.shape[1:]))


def _gdn_decode_in_place(x, gates, weight, conv, ssm, rows, valid, A_log, dt_bias, norm_weight, eps, nk, nv):
    return _gdn_decode(x.contiguous(), gates.contiguous(), weight, conv, ssm, rows, valid, A_log, dt_bias,
                       norm_weight, eps, nk, nv, in_place=True)[0]


def _gdn_decode_in_place_fake(x, gates, weight, conv, ssm, rows, valid, A_log, dt_bias, norm_weight, eps, nk,
                              nv):
    return x.new_empty(x.shape[0], nv * ssm.shape[3])


_DECODE_ARGS = ("Tensor x, Tensor gates, Tensor weight, Tensor{conv} conv, Tensor{ssm} ssm, Tensor rows, "
                "Tensor valid, Tensor A_log, Tensor dt_bias, Tensor norm_weight, float eps, int nk, int nv")
torch_ops.define("gdn_decode(" + _DECODE_ARGS.format(conv="", ssm="") + ") -> (Tensor, Tensor, Tensor)",
                 _gdn_decode_functional, _gdn_decode_functional_fake)
torch_ops.define("gdn_decode_(" + _DECODE_ARGS.format(conv="(a!)", ssm="(b!)") + ") -> Tensor",
                 _gdn_decode_in_place, _gdn_decode_in_place_fake)


def window_runs(q: torch.Tensor, initial_state: torch.Tensor) -> bool:
    """Whether `window` runs this verification window: float32 CPU tensors without gradients, a
    built kernel (loaded already, under torch.compile)."""
    ready = build.loaded() if torch.compiler.is_compiling() else available()
    return (use_kernel and q.device.type == "cpu" and q.dtype == torch.float32
            and initial_state.dtype == torch.float32 and not torch.is_grad_enabled() and ready)


def window(q, k, v, g, beta, initial_state, valid=None):
    """`mtpx.models.gated_delta_rule.window_gated_delta_rule`'s contract in one C call per window
    (mtpx/kernels/gdn_decode.c `gdn_window`: the recurrence token after token, keeping the same
    WindowStates): q, k [B, T, H, Dk]; v [B, T, H, Dv]; g, beta [B, T, H]; initial_state
    [B, H, Dk, Dv]; valid [B, T] bool or None (all valid) -> (o [B, T, H, Dv], WindowStates).
    Padding tokens (valid False, with g = beta = 0) are skipped: their o, k and v_new are 0 and
    their G the one before, so a ragged step's window costs its real tokens (the kernel's doc)."""
    args = [t.contiguous() for t in (q, k, v, g, beta, initial_state)]
    valid = None if valid is None else valid.contiguous()
    fn = torch.ops.mtpx.gdn_window if torch.compiler.is_compiling() else _gdn_window
    o, kn, v_new, G = fn(*args, valid)
    return o, WindowStates(kn, v_new, G)


def _gdn_window(q, k, v, g, beta, S0, valid=None):
    if _window is None and not available():
        raise RuntimeError("mtpx gdn_window: the CPU kernels are not built")
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    o, kn, v_new, G = (q.new_empty(B, T, H, dv), q.new_empty(B, H, T, dk), q.new_empty(B, H, T, dv),
                       q.new_empty(B, H, T))
    status = _window(q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), S0.data_ptr(),
                     None if valid is None else valid.data_ptr(), o.data_ptr(), kn.data_ptr(),
                     v_new.data_ptr(), G.data_ptr(), B, T, H, dk, dv, torch.get_num_threads())
    if status:
        raise MemoryError("mtpx gdn_window: out of memory for the kernel's scratch")
    return o, kn, v_new, G


def _gdn_window_functional(q, k, v, g, beta, S0, valid):
    return _gdn_window(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
                       S0.contiguous(), None if valid is None else valid.contiguous())


def _gdn_window_fake(q, k, v, g, beta, S0, valid):
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    return q.new_empty(B, T, H, dv), q.new_empty(B, H, T, dk), q.new_empty(B, H, T, dv), q.new_empty(B, H, T)


torch_ops.define("gdn_window(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor S0, Tensor? valid) "
                 "-> (Tensor, Tensor, Tensor, Tensor)", _gdn_window_functional, _gdn_window_fake)
