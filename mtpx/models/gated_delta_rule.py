"""The gated delta rule (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with
Delta Rule", arXiv 2412.06464) in plain PyTorch: a recurrent form (decode), a chunked form (prefill,
training; the WY representation of flash-linear-attention's `chunk_gated_delta_rule`, solving each
chunk's unit-triangular (I + L) directly, `unit_lower_solve`) and a one-chunk window form
(verification windows: the state after any window token is rebuilt later from what it keeps,
mtpx.cache.state.WindowStates). The recurrent and chunked forms are the references.

Per head, state S in R^{Dk x Dv}; k_t and q_t L2-normalised as fla's `l2norm` (x * rsqrt(sum(x^2) +
1e-6), which Qwen3-Next was trained with), q_t then scaled by Dk^-0.5; decay alpha_t = exp(g_t)
(g_t <= 0), write strength beta_t in (0, 1):

    S_t = alpha_t * S_{t-1} + beta_t * k_t (v_t - alpha_t * S_{t-1}^T k_t)^T
    o_t = S_t^T q_t

g_t = 0 and beta_t = 0 leave the state unchanged (callers pad ragged batches so). Inputs are
computed in float32 (float64 stays float64) and outputs cast back.

The dispatchers `gated_delta_rule_recurrent` / `gated_delta_rule_chunked` run flash-linear-attention
(the `gpu` extra; `fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule` and
`chunk_gated_delta_rule`) when the tensors are on CUDA, `fla` imports and the call needs nothing the
kernels lack: recurrent without `keep_all_states` (the kernel returns the final state only) or
gradients (no backward), q/k/v of one dtype among bf16/fp16/fp32; chunked without
`return_chunk_states` (prefix-caching prefills need states at block ends), q/k/v bf16 or fp16 (some
fla releases reject float32 there), Dk <= 256. They pass raw q/k with use_qk_l2norm_in_kernel=True
and scale=Dk^-0.5, layout [B, T, H, D], g float32 log decay, beta in q's dtype (as transformers' and
vLLM's Qwen3-Next), initial_state [B, H, Dk, Dv] float32, output_final_state=True; the state comes
back float32 and o in v's dtype, one contract for both paths. Otherwise the torch forms run.
`backend` (engine.gdn_backend, via ForwardMeta.gdn_backend): "auto" (that rule), "torch" (always the
torch forms), "fla" (raise where fla is missing or the tensors are off CUDA; calls needing what the
kernels lack still run the torch forms).
"""
import importlib
import sys
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mtpx.cache.state import WindowStates

GDN_BACKENDS = ("auto", "torch", "fla")
FLA_MODULE = "fla.ops.gated_delta_rule"


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(sum(x^2, -1) + eps): flash-linear-attention's `l2norm` (the eps sits inside the
    root, unlike F.normalize's clamp). x: [..., D] -> same shape and dtype."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prep(q, k, v, g, beta):
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q = l2norm(q.to(dtype)) * q.shape[-1] ** -0.5
    k = l2norm(k.to(dtype))
    return q, k, v.to(dtype), g.to(dtype), beta.to(dtype)


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=None, keep_all_states=False):
    """Token-by-token gated delta rule.

    q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g (log decay, <= 0), beta: [B, T, H];
    initial_state: [B, H, Dk, Dv] or None (zeros).
    Returns (o [B, T, H, Dv] in v's dtype, final_state [B, H, Dk, Dv] float32/64,
    all_states [B, T, H, Dk, Dv] (state after each token) or None unless keep_all_states).
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prep(q, k, v, g, beta)
    B, T, H, Dk = k.shape
    S = (torch.zeros(B, H, Dk, v.shape[-1], dtype=q.dtype, device=q.device)
         if initial_state is None else initial_state.to(q.dtype))
    outs, states = [], []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kv_mem = torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        delta = (v[:, t] - kv_mem) * beta[:, t, :, None]
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
        if keep_all_states:
            states.append(S)
    o = torch.stack(outs, dim=1).to(out_dtype)
    return o, S, (torch.stack(states, dim=1) if keep_all_states else None)


def recurrent_step_(state, q, k, v, g, beta):
    """One token of `recurrent_gated_delta_rule` written into `state` in place, without its
    state-sized temporaries: the same ops in the same order, except that the rank-1 update is one
    addcmul_ (no [B, H, Dk, Dv] product to allocate: at batch 64 a fresh 1 MB temporary per layer
    cost 1.4 ms of a 2 ms layer, AVX2 EPYC, 1 thread), which may round the sum once instead of
    twice: within 1e-6 relative of the recurrent form (tests/test_lean_step.py).
    state: [B, H, Dk, Dv] float32 (float64 for float64 inputs), updated; q, k: [B, 1, H, Dk];
    v: [B, 1, H, Dv]; g, beta: [B, 1, H]. Returns o [B, 1, H, Dv] in v's dtype."""
    out_dtype = v.dtype
    q, k, v, g, beta = _prep(q, k, v, g, beta)
    if state.dtype != q.dtype:
        raise ValueError(f"state is {state.dtype}, the step computes in {q.dtype}")
    state.mul_(g[:, 0].exp()[..., None, None])
    kv_mem = torch.einsum("bhk,bhkv->bhv", k[:, 0], state)
    delta = (v[:, 0] - kv_mem) * beta[:, 0, :, None]
    state.addcmul_(k[:, 0, :, :, None], delta[:, :, None, :])
    return torch.einsum("bhk,bhkv->bhv", q[:, 0], state)[:, None].to(out_dtype)


def unit_lower_inverse(L: torch.Tensor, block: int = 16) -> torch.Tensor:
    """(I + L)^{-1} for strictly lower triangular L [..., C, C], any C.

    Forward substitution inside diagonal blocks of size `block`, then block doubling:
    [[A, 0], [B, D]]^{-1} = [[A^-1, 0], [-D^-1 B A^-1, D^-1]]. Only matmuls and elementwise ops, so
    it is differentiable and fast on CPU, where batched LAPACK triangular solves are slow.
    """
    C = L.shape[-1]
    b = min(block, C)
    n = 1
    while n * b < C:  # pad to b * 2^i with zeros: the identity extension keeps the top-left block
        n *= 2
    if n * b > C:
        pad = n * b - C
        return unit_lower_inverse(torch.nn.functional.pad(L, (0, pad, 0, pad)), block)[..., :C, :C]
    # diagonal blocks [..., n, b, b], forward substitution row by row: W_i = -L_i - L_i W
    diag = torch.stack([L[..., i * b:(i + 1) * b, i * b:(i + 1) * b] for i in range(n)], dim=-3)
    rows = [torch.zeros_like(diag[..., 0, :])]
    for i in range(1, b):
        prev = torch.stack(rows, dim=-2)                                   # [..., n, i, b]
        li = diag[..., i, :i]                                              # [..., n, i]
        rows.append(-(li[..., None, :]
                      @ (prev + torch.eye(b, dtype=L.dtype, device=L.device)[:i]))[..., 0, :])
    W = torch.stack(rows, dim=-2) + torch.eye(b, dtype=L.dtype, device=L.device)
    blocks = [W[..., i, :, :] for i in range(n)]
    size = b
    while len(blocks) > 1:  # merge neighbours: [[A, 0], [B, D]]
        merged = []
        for j in range(0, len(blocks), 2):
            lo = j * size
            A_inv, D_inv = blocks[j], blocks[j + 1]
            B = L[..., lo + size: lo + 2 * size, lo: lo + size]
            low = -(D_inv @ B @ A_inv)
            top = torch.cat([A_inv, torch.zeros_like(A_inv)], dim=-1)
            merged.append(torch.cat([top, torch.cat([low, D_inv], dim=-1)], dim=-2))
        blocks, size = merged, 2 * size
    return blocks[0]


def unit_lower_solve(L: torch.Tensor, *rhs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(I + L)^{-1} x for each x of rhs [..., C, D_i], L [..., C, C] strictly lower triangular: one
    batched triangular solve (LAPACK's, unit diagonal: L's diagonal and upper part are not read)
    where torch has one for the dtype (float32, float64; with gradients too), else
    `unit_lower_inverse` times each. On the CPU the solve takes 0.09 ms against 0.54 ms for the
    four 64 x 64 chunks of a one-request prefill layer, 25 against 48 ms at [8, 4, 32] chunks
    (AMD EPYC, 1 thread; experiments/prefill/solve)."""
    if L.dtype in (torch.float32, torch.float64):
        x = torch.linalg.solve_triangular(L, torch.cat(rhs, -1), upper=False, unitriangular=True)
        return tuple(x.split([r.shape[-1] for r in rhs], -1))
    W = unit_lower_inverse(L)
    return tuple(W @ r for r in rhs)


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, chunk_size=64,
                           return_chunk_states=False):
    """Chunked (WY) gated delta rule; same contract as `recurrent_gated_delta_rule` without
    per-token states. Returns (o [B, T, H, Dv], final_state [B, H, Dk, Dv]), plus, with
    return_chunk_states, the state after each chunk [B, ceil(T / chunk_size), H, Dk, Dv].

    Within a chunk with cumulative log decay G_i = sum_{s<=i} g_s, let L be strictly lower triangular
    with L_ij = beta_i (k_i . k_j) exp(G_i - G_j). Then with W = (I + L)^{-1}:
    u = W (beta * v), w = W (beta * exp(G) * k); per chunk v_new = u - w S,
    o = (q * exp(G)) S + tril(q k^T * exp(G_i - G_j)) v_new,
    S <- exp(G_last) S + (k * exp(G_last - G))^T v_new.
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prep(q, k, v, g, beta)
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    pad = (chunk_size - T % chunk_size) % chunk_size
    # [B, H, N, C, D] chunks; padded tokens have g = beta = 0 and leave the state unchanged
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(1, 2).reshape(B, H, -1, chunk_size, x.shape[-1])
               for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)).transpose(1, 2).reshape(B, H, -1, chunk_size) for x in (g, beta))
    G = g.cumsum(-1)                                                     # [B, H, N, C]
    decay = (G[..., :, None] - G[..., None, :]).tril().exp().tril()      # [B, H, N, C, C]
    k_beta = k * beta[..., None]
    L = ((k_beta @ k.transpose(-1, -2)) * decay).tril(-1)
    u, w = unit_lower_solve(L, v * beta[..., None], k_beta * G.exp()[..., None])
    S = (torch.zeros(B, H, Dk, Dv, dtype=q.dtype, device=q.device)
         if initial_state is None else initial_state.to(q.dtype))
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    outs, chunk_states = [], []
    for n in range(q.shape[2]):
        qn, kn, Gn = q[:, :, n], k[:, :, n], G[:, :, n]
        v_new = u[:, :, n] - w[:, :, n] @ S                              # [B, H, C, Dv]
        attn = (qn @ kn.transpose(-1, -2) * decay[:, :, n]).masked_fill(~causal, 0)
        outs.append((qn * Gn.exp()[..., None]) @ S + attn @ v_new)
        last = Gn[..., -1, None]                                         # [B, H, 1]
        S = S * last.exp()[..., None] + (kn * (last - Gn).exp()[..., None]).transpose(-1, -2) @ v_new
        if return_chunk_states:
            chunk_states.append(S)
    o = torch.stack(outs, dim=2).reshape(B, H, -1, Dv)[:, :, :T].transpose(1, 2)
    if return_chunk_states:
        return o.to(out_dtype), S, torch.stack(chunk_states, dim=1)
    return o.to(out_dtype), S


@dataclass(frozen=True)
class PackedChunks:
    """Where the tokens of B packed sequences sit in chunks of `chunk_size` that never cross a
    sequence boundary (`chunk_gated_delta_rule_packed`); built once on the host per forward.

    Sequences are ranked by chunk count, longest first, and chunks are laid out by chunk index j,
    then rank, so that step j of the recurrence runs on the first `active[j]` states and on the
    contiguous chunk slots base[j] .. base[j] + active[j] - 1.

    Built from the B sequence lengths (host ints, each >= 1). token_index: [M * chunk_size] int64,
    the packed token of each chunk slot position (N, one past the last token, for padding);
    out_index: [N] int64, the chunk slot position of each packed token; order: [B] int64, the
    sequence at each rank; rank: [B] int64, the rank of each sequence; base, active: host ints
    per chunk index; base_t: [len(base)] int64, base on the device.
    """

    chunk_size: int
    token_index: torch.Tensor
    out_index: torch.Tensor
    order: torch.Tensor
    rank: torch.Tensor
    base: tuple
    active: tuple
    base_t: torch.Tensor

    @staticmethod
    def build(lengths, chunk_size: int, device) -> "PackedChunks":
        C = chunk_size
        n = [-(-x // C) for x in lengths]
        order = sorted(range(len(lengths)), key=lambda b: -n[b])
        starts = [0]
        for x in lengths:
            starts.append(starts[-1] + x)
        N = starts[-1]
        active = tuple(sum(1 for b in order if n[b] > j) for j in range(max(n, default=0)))
        base = tuple(sum(active[:j]) for j in range(len(active)))
        token_index = torch.full((sum(active) * C,), N, dtype=torch.long)
        out_index = torch.empty(N, dtype=torch.long)
        for j, a in enumerate(active):
            for i in range(a):
                b = order[i]
                lo, hi = j * C, min((j + 1) * C, lengths[b])
                slot = (base[j] + i) * C
                token_index[slot: slot + hi - lo] = torch.arange(starts[b] + lo, starts[b] + hi)
                out_index[starts[b] + lo: starts[b] + hi] = torch.arange(slot, slot + hi - lo)
        order_t = torch.tensor(order, dtype=torch.long)
        rank = torch.empty_like(order_t)
        rank[order_t] = torch.arange(len(order))
        return PackedChunks(C, token_index.to(device), out_index.to(device),
                            order_t.to(device), rank.to(device), base, active,
                            torch.tensor(base, dtype=torch.long, device=device))


def chunk_gated_delta_rule_packed(q, k, v, g, beta, chunks: PackedChunks, initial_state,
                                  return_chunk_states=False):
    """`chunk_gated_delta_rule` over B sequences packed along one token axis (flash-linear-
    attention's varlen layout, lengths in `chunks`), in chunks that never cross a sequence, so a
    batch costs its tokens and not B times the longest; same contract otherwise.

    q, k: [N, H, Dk]; v: [N, H, Dv]; g, beta: [N, H]; initial_state: [B, H, Dk, Dv].
    Returns (o [N, H, Dv] in v's dtype, final_state [B, H, Dk, Dv]), plus, with
    return_chunk_states, the state after every chunk [M, H, Dk, Dv] in chunk slot order (the
    state after chunk j of sequence b: slot chunks.base_t[j] + chunks.rank[b]).

    Each chunk's (I + L) X = [beta v, beta exp(G) k] is one batched unit-triangular solve; the
    recurrence over chunks runs step j on the sequences that have a chunk j, in place on their
    states (module doc of `chunk_gated_delta_rule` for the formulas). Within float rounding of
    the reference (tests/test_prefill_packed.py); no gradients (in-place updates).
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prep(q, k, v, g, beta)
    C, H = chunks.chunk_size, k.shape[1]
    M = len(chunks.token_index) // C

    def to_chunks(x):                                             # [N, H, ...] -> [M, H, C, ...]
        x = torch.cat([x, x.new_zeros(1, *x.shape[1:])]).index_select(0, chunks.token_index)
        return x.view(M, C, *x.shape[1:]).transpose(1, 2)

    q, k, v = (to_chunks(x) for x in (q, k, v))
    g, beta = (to_chunks(x) for x in (g, beta))                   # [M, H, C]; padding: g = beta = 0
    G = g.cumsum(-1)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    L = (k_beta @ k.transpose(-1, -2)) * decay                    # the solve reads its strict lower part
    Dv = v.shape[-1]
    u, w = unit_lower_solve(L, v * beta[..., None], k_beta * G.exp()[..., None])
    attn = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * G.exp()[..., None]
    last = G[..., -1:]                                            # [M, H, 1]
    k_decayed = (k * (last - G).exp()[..., None]).transpose(-1, -2)   # [M, H, Dk, C]
    S = initial_state.to(q.dtype).index_select(0, chunks.order)   # by rank
    o = torch.empty(M, H, C, Dv, dtype=q.dtype, device=q.device)
    states = torch.empty(M, *S.shape[1:], dtype=q.dtype, device=q.device) if return_chunk_states else None
    for base, a in zip(chunks.base, chunks.active):
        sl = slice(base, base + a)
        Sa = S[:a].flatten(0, 1)                                  # [a H, Dk, Dv], a view
        v_new = torch.baddbmm(u[sl].flatten(0, 1), w[sl].flatten(0, 1), Sa, alpha=-1)
        out = o[sl].flatten(0, 1)
        torch.bmm(q_decayed[sl].flatten(0, 1), Sa, out=out)
        out.baddbmm_(attn[sl].flatten(0, 1), v_new)
        Sa.mul_(last[sl].exp().flatten(0, 1)[..., None]).baddbmm_(k_decayed[sl].flatten(0, 1), v_new)
        if states is not None:
            states[sl] = S[:a]
    o = o.transpose(1, 2).reshape(M * C, H, Dv).index_select(0, chunks.out_index)
    final = S.index_select(0, chunks.rank)
    if return_chunk_states:
        return o.to(out_dtype), final, states
    return o.to(out_dtype), final


def unit_lower_inverse_small(L: torch.Tensor) -> torch.Tensor:
    """(I + L)^{-1} for strictly lower triangular L [..., T, T] in ceil(log2 T) squarings: L is
    nilpotent (L^T = 0), so (I + L)^{-1} = sum_i (-L)^i = (I - L)(I + L^2)(I + L^4)... A fixed
    number of matmuls whatever the values, which suits short verification windows."""
    T = L.shape[-1]
    eye = torch.eye(T, dtype=L.dtype, device=L.device)
    inv, power, n = eye - L, L, 2
    while n < T:
        power = power @ power
        inv = inv @ (eye + power)
        n *= 2
    return inv


def window_gated_delta_rule(q, k, v, g, beta, initial_state):
    """The gated delta rule over one short window (a verification window: the last token and
    the drafts) as a single chunk, keeping what `WindowStates.state_at` needs to rebuild the
    state after any window token later, instead of every token's state.

    q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g, beta: [B, T, H]; initial_state: [B, H, Dk, Dv].
    Returns (o [B, T, H, Dv] in v's dtype, WindowStates). Same outputs as
    `recurrent_gated_delta_rule` within float rounding (tests/test_gated_delta_rule.py).
    """
    out_dtype = v.dtype
    q, k, v, g, beta = (x.transpose(1, 2) for x in _prep(q, k, v, g, beta))     # [B, H, T, ...]
    S0 = initial_state.to(q.dtype)
    G = g.cumsum(-1)                                                             # [B, H, T]
    decay = (G[..., :, None] - G[..., None, :]).tril().exp().tril()              # [B, H, T, T]
    k_beta = k * beta[..., None]
    W = unit_lower_inverse_small(((k_beta @ k.transpose(-1, -2)) * decay).tril(-1))
    v_new = W @ (v * beta[..., None]) - (W @ (k_beta * G.exp()[..., None])) @ S0
    o = (q * G.exp()[..., None]) @ S0 + ((q @ k.transpose(-1, -2)) * decay) @ v_new
    return o.transpose(1, 2).to(out_dtype), WindowStates(k, v_new, G)


# --------------------------------------------------------------------------------------------
# dispatch: flash-linear-attention's kernels on CUDA when usable, the references above otherwise

_fla_import_error: ImportError | None = None  # remembered so a missing fla costs one import attempt


def _on_cuda(x: torch.Tensor) -> bool:
    return x.is_cuda


def _fla_ops():
    """fla.ops.gated_delta_rule, or None when it does not import."""
    global _fla_import_error
    if _fla_import_error is not None and FLA_MODULE not in sys.modules:
        return None
    try:
        return importlib.import_module(FLA_MODULE)
    except ImportError as err:
        _fla_import_error = err
        return None


def _fla_for(q, k, v, dtypes, backend: str):
    """The fla module to use for this call, or None for the torch forms (module doc)."""
    if backend not in GDN_BACKENDS:
        raise ValueError(f"engine.gdn_backend={backend!r}: choose one of {', '.join(GDN_BACKENDS)}")
    if backend == "torch" or not (q.dtype == k.dtype == v.dtype and q.dtype in dtypes):
        return None
    if not _on_cuda(q):
        if backend == "fla":
            raise ValueError(f"engine.gdn_backend=fla needs CUDA tensors (these are on {q.device}): "
                             "use engine.gdn_backend=auto or torch")
        return None
    ops = _fla_ops()
    if ops is None and backend == "fla":
        raise ValueError(f"engine.gdn_backend=fla needs flash-linear-attention ({_fla_import_error}): "
                         "pip install -e '.[gpu]', or use engine.gdn_backend=torch")
    return ops


def _fla_call(fn, q, k, v, g, beta, initial_state):
    """One fla kernel call in our conventions; returns (o in v's dtype, final state float32)."""
    o, final = fn(q.contiguous(), k.contiguous(), v.contiguous(),
                  g=g.float().contiguous(), beta=beta.to(q.dtype).contiguous(),
                  scale=q.shape[-1] ** -0.5,
                  initial_state=None if initial_state is None else initial_state.float().contiguous(),
                  output_final_state=True, use_qk_l2norm_in_kernel=True)
    return o.to(v.dtype), final.float()


def gated_delta_rule_recurrent(q, k, v, g, beta, initial_state=None, keep_all_states=False,
                               backend: str = "auto"):
    """`recurrent_gated_delta_rule`'s contract; fla's fused_recurrent_gated_delta_rule on CUDA
    without keep_all_states or gradients (module doc), the torch form otherwise."""
    needs_grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, g, beta, initial_state))
    ops = None if keep_all_states or needs_grad else _fla_for(
        q, k, v, (torch.bfloat16, torch.float16, torch.float32), backend)
    if ops is None:
        return recurrent_gated_delta_rule(q, k, v, g, beta, initial_state, keep_all_states=keep_all_states)
    o, final = _fla_call(ops.fused_recurrent_gated_delta_rule, q, k, v, g, beta, initial_state)
    return o, final, None


def recurrent_step_in_place(q, state, backend: str = "auto") -> bool:
    """Whether gated_delta_rule_recurrent of one token would run the torch form on these
    tensors, so that recurrent_step_ on `state` gives its values: no fla kernel, no gradient,
    state in the dtype the step computes in."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return (state.dtype == dtype and not torch.is_grad_enabled() and q.shape[1] == 1
            and _fla_for(q, q, q, (torch.bfloat16, torch.float16, torch.float32), backend) is None)


def gated_delta_rule_chunked(q, k, v, g, beta, initial_state=None, chunk_size=64,
                             return_chunk_states=False, backend: str = "auto"):
    """`chunk_gated_delta_rule`'s contract; fla's chunk_gated_delta_rule on CUDA in bf16/fp16
    without return_chunk_states (module doc; the kernel's own chunk size is 64 whatever
    chunk_size says, which changes no result), the torch form otherwise."""
    ops = None if return_chunk_states or q.shape[-1] > 256 else _fla_for(
        q, k, v, (torch.bfloat16, torch.float16), backend)
    if ops is None:
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state, chunk_size=chunk_size,
                                      return_chunk_states=return_chunk_states)
    with warnings.catch_warnings():  # fla warns when T < H, suspecting a head-first layout; ours is not
        warnings.filterwarnings("ignore", message="Input tensor shape suggests")
        return _fla_call(ops.chunk_gated_delta_rule, q, k, v, g, beta, initial_state)
