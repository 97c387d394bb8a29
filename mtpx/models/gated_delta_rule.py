"""The gated delta rule (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with
Delta Rule", arXiv 2412.06464) in plain PyTorch: a recurrent form (decode, verification windows) and
a chunked form (prefill, training). Both are the reference implementations; the chunked form uses the
WY representation of flash-linear-attention's `chunk_gated_delta_rule`, inverting the
unit-triangular (I + L) of each chunk directly.

Per head, with state S in R^{Dk x Dv}, unit-norm k_t (L2-normalised here, as flash-linear-attention's
`l2norm`: x * rsqrt(sum(x^2) + 1e-6), which Qwen3-Next checkpoints were trained with), q_t
L2-normalised the same way and scaled by Dk^-0.5,
decay alpha_t = exp(g_t) (g_t <= 0) and write strength beta_t in (0, 1):

    S_t = alpha_t * S_{t-1} + beta_t * k_t (v_t - alpha_t * S_{t-1}^T k_t)^T
    o_t = S_t^T q_t

A token with g_t = 0 and beta_t = 0 leaves the state unchanged: callers use this to pad ragged
batches. Inputs are computed in float32 (float64 stays float64) and outputs cast back.
"""
import torch
import torch.nn.functional as F


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
        rows.append(-(li[..., None, :] @ (prev + torch.eye(b, dtype=L.dtype, device=L.device)[:i]))[..., 0, :])
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
    W = unit_lower_inverse(L)
    u = W @ (v * beta[..., None])
    w = W @ (k_beta * G.exp()[..., None])
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
