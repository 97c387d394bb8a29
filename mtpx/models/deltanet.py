"""Gated DeltaNet linear-attention layer as in Qwen3-Next (Hugging Face `Qwen3NextGatedDeltaNet`).

in_proj_qkvz -> (q, k, v, z) grouped per key head; in_proj_ba -> (b, a) per value head;
q, k, v pass through a short depthwise causal conv (kernel `linear_conv_kernel_dim`) with SiLU;
beta = sigmoid(b), log decay g = -exp(A_log) * softplus(a + dt_bias) (Mamba-2 style);
the gated delta rule (mtpx.models.gated_delta_rule) mixes tokens; RMSNormGated(o, z); out_proj.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtpx.cache.state import RecurrentState, RecurrentStateSpec, read_rows, write_rows
from mtpx.models import gdn_kernel
from mtpx.models.config import ModelConfig
from mtpx.models.gated_delta_rule import (PackedChunks, chunk_gated_delta_rule_packed,
                                          gated_delta_rule_chunked, gated_delta_rule_recurrent,
                                          recurrent_step_, recurrent_step_in_place, window_gated_delta_rule)
from mtpx.attention.meta import ForwardMeta
from mtpx.models.norm import RMSNormGated
from mtpx.models.linear import Linear

RECURRENT_MAX_LEN = 16  # below this many tokens the recurrent form is cheaper than chunking
PACKED_CHUNK = 16       # chunk of the packed prefill without boundary states (block_size with them)
use_prefill_kernel = True   # False: prefills run the torch forms (comparisons: experiments/prefill/kernel)


def causal_conv(ext: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv without bias: ext [B, C, K-1+T] (the K-1 inputs before the window,
    then its T), weight [C, 1, K] -> [B, C, T]. The forms compute the same sum; the one that runs
    is the fastest measured on the CPU, eager (experiments/step_costs/gdn_conv: 2 cores, C = 256, K = 4):
    one token, the sum over the unfolded taps (5-60 µs alone); more tokens in float32 or
    float64, K fused multiply-adds (15-214 µs alone against 17-3,060 unfolded, whose strided
    [B, C, T, K] view does not vectorize: at batch 64 it was a fifth of a 9-token verification
    forward; inside the forward as fast as F.conv1d, which costs 45 µs at batch 1); half
    precisions above 16 rows (B x T), F.conv1d (it accumulates in float32, the taps would round
    after each). Compiled (Inductor fuses the unfolded sum into one loop), on CUDA, with
    gradients (under autocast F.conv1d would change the dtype) or mixed dtypes: the unfolded
    sum."""
    B, C, L = ext.shape
    K = weight.shape[-1]
    T = L - K + 1
    half = ext.dtype not in (torch.float32, torch.float64)
    if (T == 1 or ext.device.type != "cpu" or torch.compiler.is_compiling() or torch.is_grad_enabled()
            or ext.dtype != weight.dtype or (half and B * T <= 16)):
        return (ext.unfold(-1, K, 1) * weight[:, 0, None, :]).sum(-1)
    if half:
        return F.conv1d(ext, weight, groups=C)
    w = weight[:, 0]                                                    # [C, K]
    out = ext[..., :T] * w[:, :1]
    for j in range(1, K):
        out.addcmul_(ext[..., j: j + T], w[:, j: j + 1])
    return out


@dataclass(frozen=True)
class PackedConv:
    """The packed prefill's layout (`GatedDeltaNet._forward_packed`), made once per forward: the
    conv input `ext` holds, request after request, its K-1 stored inputs and then its tokens.

    rows: rows of ext; seg: [B] int64, each request's first row; token_rows: [N] int64, the row of
    each packed token; prev_rows: [B (K-1)] int64, the rows of the stored inputs; conv_rows: [N]
    int64, the first of the K rows each token's conv output sums (token_rows - (K-1));
    state_rows: [B (K-1)] int64, the K-1 inputs ending at each request's last token (its new conv
    state); chunks: the recurrence's chunk layout.
    """

    rows: int
    seg: torch.Tensor
    token_rows: torch.Tensor
    prev_rows: torch.Tensor
    conv_rows: torch.Tensor
    state_rows: torch.Tensor
    chunks: PackedChunks

    @staticmethod
    def build(lengths: list[int], kernel: int, chunk_size: int, device) -> "PackedConv":
        K1, seg, rows = kernel - 1, [], 0
        for n in lengths:
            seg.append(rows)
            rows += K1 + n
        span = lambda lo, n: range(lo, lo + n)  # noqa: E731
        token = [r for s, n in zip(seg, lengths) for r in span(s + K1, n)]
        prev = [r for s in seg for r in span(s, K1)]
        state = [r for s, n in zip(seg, lengths) for r in span(s + n, K1)]
        t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        return PackedConv(rows, t(seg), t(token), t(prev), t([r - K1 for r in token]), t(state),
                          PackedChunks.build(lengths, chunk_size, device))


def _kernel_recurrence(q, k, v, g, beta, init, valid, save_states, block_size: int):
    """A prefill's gated delta rule in mtpx's C window kernel (`gdn_kernel.window`, the recurrence
    token after token; CPU float32 without gradients: `gdn_kernel.window_runs`), 3.6-7x the chunked
    form's speed on the CPU at 8-300 tokens and within 2e-6 of it (experiments/prefill/kernel).
    q, k [B, T, H, Dk]; v [B, T, H, Dv]; g, beta [B, T, H]; init [B, H, Dk, Dv]; valid [B, T] bool
    (padding skipped) or None; save_states: ForwardMeta.save_states or None, at block ends of
    block_size tokens -> (o [B, T, H, Dv], the state after each row's last real token
    [B, H, Dk, Dv], the states after token ti of row bi [S, H, Dk, Dv] or None). Raises
    ValueError when a boundary state is not at a block end."""
    o, window = gdn_kernel.window(q, k, v, g, beta, init, valid)
    B, T = q.shape[:2]
    final = window.state_after(init, torch.full((B,), T - 1, dtype=torch.long, device=q.device))
    if save_states is None:
        return o, final, None
    bi, ti, _ = save_states
    if bool(((ti + 1) % block_size != 0).any()):
        raise ValueError("boundary states must sit at block ends of block-aligned prefills")
    return o, final, _block_end_states(window, init, block_size)[bi, (ti + 1) // block_size - 1]


def _block_end_states(window, init: torch.Tensor, block_size: int) -> torch.Tensor:
    """The state after every block_size-th token of each row, from a window's WindowStates
    (k [B, H, T, Dk], v_new [B, H, T, Dv], G [B, H, T]) and the rows' states before it
    init [B, H, Dk, Dv] -> [B, ceil(T / block_size), H, Dk, Dv]: each block's own update
    sum_j exp(G_end - G_j) k_j v_new_j^T in one batched matmul, then block after block
    S_c = exp(G_end_c - G_end_{c-1}) S_{c-1} + update_c (the chunked form's state recurrence;
    memory and work linear in T, where WindowStates.state_at per boundary is quadratic)."""
    k, v, G = window.k, window.v_new, window.G
    B, H, T, Dk = k.shape
    C = -(-T // block_size)
    pad = C * block_size - T
    if pad:    # padding tokens add nothing: k = v_new = 0, G the last one
        k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        G = torch.cat([G, G[..., -1:].expand(B, H, pad)], dim=-1)
    G = G.view(B, H, C, block_size)
    end = G[..., -1]                                                         # [B, H, C]
    kw = k.view(B, H, C, block_size, Dk) * (end[..., None] - G).exp()[..., None]
    update = kw.transpose(-1, -2) @ v.view(B, H, C, block_size, -1)          # [B, H, C, Dk, Dv]
    decay = torch.diff(end, dim=-1, prepend=end.new_zeros(B, H, 1)).exp()   # exp(G_end_c - G_end_{c-1})
    states, S = [], init.to(update.dtype)
    for c in range(C):
        S = decay[..., c, None, None] * S + update[:, :, c]
        states.append(S)
    return torch.stack(states, dim=1)


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet mixer; forward(x [B, T, hidden]) -> [B, T, hidden] (module doc). Weight
    names and the q/k/v/z grouping follow Hugging Face Qwen3-Next checkpoints."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.kernel = cfg.linear_conv_kernel_dim
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        # holds the depthwise weight [C, 1, K] under HF's name; forward applies it by hand
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim,
                                bias=False)
        self.in_proj_qkvz = Linear(cfg.hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = Linear(cfg.hidden_size, 2 * self.nv, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.empty(self.nv).uniform_(1e-3, 16).log())
        self.norm = RMSNormGated(self.dv, cfg.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, cfg.hidden_size, bias=False)

    def _split(self, qkvz, ba):
        """Hugging Face's per-key-head grouping of the in_proj_qkvz / in_proj_ba outputs (each
        [B, T, out_features])."""
        B, T, _ = qkvz.shape
        r = self.nv // self.nk
        qkvz = qkvz.view(B, T, self.nk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = qkvz.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        b, a = ba.view(B, T, self.nk, 2 * r).split([r, r], dim=-1)
        return (q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1),
                z.reshape(B, T, self.nv, self.dv), b.reshape(B, T, self.nv), a.reshape(B, T, self.nv))

    def _rule_inputs(self, conv, b, a):
        """The gated delta rule's inputs: conv [..., conv_dim] (after SiLU), b, a [..., nv] ->
        q, k [..., nv, dk], v [..., nv, dv], beta, g [..., nv] (module doc)."""
        q, k, v = conv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        # each key head serves nv / nk value heads (repeat_interleave, as an expand: it would
        # guard on B != 1 under torch.compile, and a batch of one shares the batch-2 graph)
        lead = (-1,) * (conv.dim() - 1)
        q, k = (x.unflatten(-1, (self.nk, 1, self.dk)).expand(*lead, -1, self.nv // self.nk, -1)
                .flatten(-3, -2) for x in (q, k))
        v = v.unflatten(-1, (self.nv, self.dv))
        beta = torch.sigmoid(b)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        return q, k, v, beta, g

    def _prefill(self, q, k, v, g, beta, ext, state: RecurrentState, meta: ForwardMeta):
        """Cached forward without per-token states; stores the boundary states meta.save_states
        asks for. Those sit at block ends and every request of a prefill starts at a block
        boundary, so with chunk_size = block_size they are exactly the chunk-end states. One
        token without boundary states updates the rows' states in place (read_rows: a view of
        the state when the rows are an ascending run) and returns them as the final state. On
        the CPU in float32 the C window kernel runs the recurrence (`_kernel_recurrence`)."""
        init = read_rows(state.ssm, meta.rows, meta.row_run)
        T = q.shape[1]
        save = meta.save_states if meta.save_states is not None and state.block_ssm is not None else None
        if save is None and recurrent_step_in_place(q, init, meta.gdn_backend):
            return recurrent_step_(init, q, k, v, g, beta), init
        kernel = use_prefill_kernel and gdn_kernel.window_runs(q, init)
        if save is None:
            if kernel:
                return _kernel_recurrence(q, k, v, g, beta, init, meta.valid, None, meta.block_size)[:2]
            fn = gated_delta_rule_recurrent if T <= RECURRENT_MAX_LEN else gated_delta_rule_chunked
            return fn(q, k, v, g, beta, init, backend=meta.gdn_backend)[:2]
        bi, ti, blocks = save
        if kernel:
            o, final, ssm = _kernel_recurrence(q, k, v, g, beta, init, meta.valid, save, meta.block_size)
        elif T <= RECURRENT_MAX_LEN:
            o, final, states = gated_delta_rule_recurrent(q, k, v, g, beta, init, keep_all_states=True)
            ssm = states[bi, ti]
        else:
            S = meta.block_size
            if bool(((ti + 1) % S != 0).any()):
                raise ValueError("boundary states must sit at block ends of block-aligned prefills")
            o, final, chunk_states = gated_delta_rule_chunked(q, k, v, g, beta, init, chunk_size=S,
                                                            return_chunk_states=True)
            ssm = chunk_states[bi, (ti + 1) // S - 1]
        # conv window after token t: the K-1 inputs ending at t (ext index t + K - 1)
        idx = ti[:, None, None] + 1 + torch.arange(self.kernel - 1, device=q.device)
        conv = ext[bi].gather(2, idx.expand(-1, self.conv_dim, -1))
        state.save_blocks(blocks, conv, ssm)
        return o, final

    def _packed_prefill(self, qkvz: torch.Tensor, state: RecurrentState, meta: ForwardMeta) -> bool:
        """Whether this packed forward runs `_forward_packed`: a prefill (no verification window)
        with a request longer than RECURRENT_MAX_LEN, float32/float64 without gradients, on the
        torch forms (gdn_backend torch, or auto off CUDA), boundary states (if any) at chunks of
        at most 64 tokens."""
        return (not meta.keep_states and meta.packed_lengths is not None
                and max(meta.packed_lengths, default=0) > RECURRENT_MAX_LEN
                and qkvz.dtype in (torch.float32, torch.float64) and not torch.is_grad_enabled()
                and (meta.gdn_backend == "torch" or (meta.gdn_backend == "auto" and not qkvz.is_cuda))
                and (meta.save_states is None or state.block_ssm is None or meta.block_size <= 64))

    def _forward_packed(self, qkvz: torch.Tensor, ba: torch.Tensor, state: RecurrentState,
                        meta: ForwardMeta) -> torch.Tensor:
        """`forward` of a packed prefill on its N real tokens alone ([N, ...] throughout): the conv
        over each request's stored inputs and tokens laid end to end (`PackedConv`), the
        recurrence in chunks that never cross a request (`chunk_gated_delta_rule_packed`; on the
        CPU in float32 the C window kernel on the grid, `_kernel_recurrence`), the same states
        stored. Within float rounding of the grid path (tests/test_prefill_packed.py)."""
        save = meta.save_states is not None and state.block_ssm is not None
        chunk = meta.block_size if save else PACKED_CHUNK
        key = ("gdn_packed", self.kernel, chunk)
        lay = meta.memo.get(key)
        if lay is None:
            lay = meta.memo[key] = PackedConv.build(meta.packed_lengths, self.kernel, chunk, qkvz.device)
        q, k, v, z, b, a = (t[0] for t in self._split(qkvz[None], ba[None]))
        mixed = torch.cat([q, k, v], dim=-1)                               # [N, C]
        B, K1 = len(meta.packed_lengths), self.kernel - 1
        prev = read_rows(state.conv, meta.rows, meta.row_run).to(mixed.dtype)   # [B, C, K-1]
        ext = mixed.new_empty(lay.rows, self.conv_dim)
        ext.index_copy_(0, lay.prev_rows, prev.transpose(1, 2).reshape(B * K1, -1))
        ext.index_copy_(0, lay.token_rows, mixed)
        w = self.conv1d.weight[:, 0].to(ext.dtype)                         # [C, K]
        R = lay.rows - K1                 # row r sums ext rows r .. r + K-1 (causal_conv's fused form)
        out = ext[:R] * w[:, 0]
        for j in range(1, self.kernel):
            out.addcmul_(ext[j: j + R], w[:, j])
        conv = F.silu(out.index_select(0, lay.conv_rows))
        q, k, v, beta, g = self._rule_inputs(conv, b, a)
        init = read_rows(state.ssm, meta.rows, meta.row_run)
        # on the grid: the kernel skips its padding
        if use_prefill_kernel and gdn_kernel.window_runs(q, init):
            o, final, ssm = _kernel_recurrence(*(meta.unpack(x) for x in (q, k, v, g, beta)), init,
                                               meta.valid, meta.save_states if save else None,
                                               meta.block_size)
            o = meta.pack(o)
        else:
            res = chunk_gated_delta_rule_packed(q, k, v, g, beta, lay.chunks, init, return_chunk_states=save)
            o, final = res[0], res[1]
            if save:
                ti = meta.save_states[1]
                if bool(((ti + 1) % chunk != 0).any()):
                    raise ValueError("boundary states must sit at block ends of block-aligned prefills")
                ssm = res[2][lay.chunks.base_t[(ti + 1) // chunk - 1] + lay.chunks.rank[meta.save_states[0]]]
        if save:
            bi, ti, blocks = meta.save_states
            idx = lay.seg[bi, None] + ti[:, None] + 1 + torch.arange(K1, device=ti.device)   # [S, K-1]
            state.save_blocks(blocks, ext[idx].transpose(1, 2), ssm)
        write_rows(state.ssm, meta.rows, final, meta.row_run)
        new_conv = ext.index_select(0, lay.state_rows).view(B, K1, -1).transpose(1, 2)
        write_rows(state.conv, meta.rows, new_conv.to(state.conv.dtype), meta.row_run)
        return self.out_proj(self.norm(o, z).flatten(-2))

    def cache_spec(self) -> RecurrentStateSpec:
        """What this layer needs cached: its recurrent state (ModelCache builds it)."""
        return RecurrentStateSpec(self.conv_dim, self.kernel, self.nv, self.dk, self.dv)

    def forward(self, x: torch.Tensor, state: RecurrentState | None = None,
                meta: ForwardMeta | None = None) -> torch.Tensor:
        """x: [B, T, hidden] -> [B, T, hidden] ([N, hidden] -> [N, hidden] when meta.packed: the
        projections run on the real tokens, the conv and the recurrence on the grid). With
        `state`, continues each request's row from its stored state and stores the new one (or,
        with meta.keep_states, keeps the window in state.keep_window for a later commit at the
        accepted token)."""
        packed = meta is not None and meta.packed is not None
        qkvz, ba = self.in_proj_qkvz(x), self.in_proj_ba(x)
        if gdn_kernel.runs(self, qkvz, state, meta):     # one decode token per request, on the CPU
            return self.out_proj(gdn_kernel.decode(self, qkvz, ba, state, meta))
        if packed and state is not None and self._packed_prefill(qkvz, state, meta):
            return self._forward_packed(qkvz, ba, state, meta)
        if packed:
            qkvz, ba = meta.unpack(qkvz), meta.unpack(ba)
        B, T, _ = qkvz.shape
        q, k, v, z, b, a = self._split(qkvz, ba)
        mixed = torch.cat([q, k, v], dim=-1).transpose(1, 2)             # [B, C, T]
        prev = (mixed.new_zeros(B, self.conv_dim, self.kernel - 1) if state is None
                else read_rows(state.conv, meta.rows, meta.row_run).to(mixed.dtype))
        ext = torch.cat([prev, mixed], dim=-1)                            # [B, C, K-1+T]
        conv = F.silu(causal_conv(ext, self.conv1d.weight)).transpose(1, 2)
        q, k, v, beta, g = self._rule_inputs(conv, b, a)
        if meta is not None:  # padding tokens: g = beta = 0 leaves the state untouched
            beta, g = beta * meta.valid[..., None], g * meta.valid[..., None]

        if state is None:
            o, _ = gated_delta_rule_chunked(q, k, v, g, beta)
        elif meta.keep_states:  # a verification window: the state after each token on demand
            init = read_rows(state.ssm, meta.rows, meta.row_run)
            if gdn_kernel.window_runs(q, init):   # padding tokens skipped: a ragged window costs its tokens
                o, window = gdn_kernel.window(q, k, v, g, beta, init, meta.valid)
            else:
                o, window = window_gated_delta_rule(q, k, v, g, beta, init)
            state.keep_window(meta.rows, window, ext, meta.row_run)
        else:
            o, final = self._prefill(q, k, v, g, beta, ext, state, meta)
            write_rows(state.ssm, meta.rows, final, meta.row_run)
            last = meta.lengths                                             # window ends at len-1
            idx = last[:, None, None] + torch.arange(self.kernel - 1, device=x.device)
            new_conv = ext.gather(2, idx.expand(B, self.conv_dim, -1)).to(state.conv.dtype)
            write_rows(state.conv, meta.rows, new_conv, meta.row_run)

        if packed:
            o, z = meta.pack(o), meta.pack(z)
        o = self.norm(o, z)
        return self.out_proj(o.flatten(-2))
