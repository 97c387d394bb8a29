"""Per-layer inference state: what each layer declares it needs (KVCacheSpec for attention,
RecurrentStateSpec for Gated DeltaNet; ModelCache builds from them) and the recurrent state of
Gated DeltaNet layers. The paged KV cache itself is the attention package's
(mtpx.attention.kv_cache.KVCache). Recurrent states are indexed by the request's batch slot (row); with prefix caching on a hybrid
model, the state at every full block boundary is also stored per block so that a prefix hit can
resume from it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVCacheSpec:
    """What an attention layer needs cached (vLLM's KVCacheSpec): a paged KV cache of
    num_kv_heads x head_dim per position (mtpx.attention.kv_cache.KVCache); num_heads: its query
    heads (the attention backend plans with them)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class RecurrentStateSpec:
    """What a Gated DeltaNet layer needs cached (RecurrentState.allocate's sizes): the conv window
    of conv_dim channels x (kernel - 1) and the delta-rule memory heads x key_dim x value_dim."""

    conv_dim: int
    kernel: int
    heads: int
    key_dim: int
    value_dim: int

    def bytes_per_state(self, element_size: int) -> int:
        """One boundary state: the conv window in the model dtype plus the fp32 memory."""
        return self.conv_dim * (self.kernel - 1) * element_size + self.heads * self.key_dim * self.value_dim * 4


@dataclass
class WindowStates:
    """A verification window's Gated DeltaNet states, kept in chunked form instead of one
    [Dk, Dv] state per token: the state after window token t of row b is

        S_t = exp(G_t) S_0 + sum_{j <= t} exp(G_t - G_j) k_j v_new_j^T

    (the chunked form's state update, mtpx.models.gated_delta_rule, applied to the prefix 0..t;
    exact because the WY factors are lower triangular, so v_new_j reads tokens <= j only).

    k: [B, H, T, Dk] L2-normalised keys; v_new: [B, H, T, Dv]; G: [B, H, T] cumulative log
    decay; all float32 (float64 for float64 inputs).
    """

    k: torch.Tensor
    v_new: torch.Tensor
    G: torch.Tensor

    def state_at(self, initial_state: torch.Tensor, batch_idx: torch.Tensor,
                 token_idx: torch.Tensor) -> torch.Tensor:
        """The state after token token_idx[i] of row batch_idx[i] (both [N] int64), from those
        rows' states before the window, initial_state [N, H, Dk, Dv] -> [N, H, Dk, Dv]."""
        G, k, v_new = self.G[batch_idx], self.k[batch_idx], self.v_new[batch_idx]
        N, H, T = G.shape
        G_t = G.gather(-1, token_idx.view(N, 1, 1).expand(N, H, 1))                 # [N, H, 1]
        upto = torch.arange(T, device=G.device) <= token_idx.view(N, 1, 1)          # [N, 1, T]
        weight = torch.where(upto, (G_t - G).exp(), 0)                              # [N, H, T]
        return (G_t.exp()[..., None] * initial_state.to(G.dtype)
                + (k * weight[..., None]).transpose(-1, -2) @ v_new)


@dataclass
class RecurrentState:
    """Gated DeltaNet state of every batch slot.

    conv: [rows, conv_dim, kernel - 1], the last kernel-1 inputs of the short causal conv.
    ssm: [rows, heads, key_dim, value_dim], the delta-rule memory (float32, float64 in fp64 models).
    block_conv, block_ssm: [num_blocks, ...] or None: the state after the last token of each full
        paged block (prefix caching of hybrid models).
    After a forward with keep_states (a verification window), for `pending_rows`: `pending_conv`
    [B, T, conv_dim, K-1] the conv window after every token and `pending_window` the delta-rule
    window in chunked form (WindowStates, from window_gated_delta_rule); `commit(index)` builds
    the state after the accepted token of each request from them (invariant 3: a rejection
    selects a state, never re-runs the model).
    """

    conv: torch.Tensor
    ssm: torch.Tensor
    block_conv: torch.Tensor | None = None
    block_ssm: torch.Tensor | None = None
    pending_conv: torch.Tensor | None = None
    pending_window: WindowStates | None = None
    pending_rows: torch.Tensor | None = None

    @staticmethod
    def allocate(rows: int, conv_dim: int, kernel: int, heads: int, key_dim: int, value_dim: int,
                 dtype, device="cpu", num_blocks: int = 0):
        """num_blocks > 0 also allocates the per-block boundary states."""
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        conv = lambda n: torch.zeros(n, conv_dim, kernel - 1, dtype=dtype, device=device)  # noqa: E731
        ssm = lambda n: torch.zeros(n, heads, key_dim, value_dim, dtype=state_dtype, device=device)  # noqa: E731
        return RecurrentState(conv(rows), ssm(rows), conv(num_blocks) if num_blocks else None,
                              ssm(num_blocks) if num_blocks else None)

    def save_blocks(self, block_ids: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        """Store boundary states: block_ids [S]; conv [S, conv_dim, K-1]; ssm [S, H, Dk, Dv]."""
        if self.block_ssm is None or block_ids.numel() == 0:
            return
        self.block_conv[block_ids] = conv.to(self.block_conv.dtype)
        self.block_ssm[block_ids] = ssm.to(self.block_ssm.dtype)

    def load_rows(self, rows: torch.Tensor, block_ids: torch.Tensor) -> None:
        """Start rows [B] from the boundary state of block_ids [B] (-1: from zeros)."""
        hit = block_ids >= 0
        self.conv[rows] = 0
        self.ssm[rows] = 0
        if bool(hit.any()):
            self.conv[rows[hit]] = self.block_conv[block_ids[hit]]
            self.ssm[rows[hit]] = self.block_ssm[block_ids[hit]]

    def commit(self, index: torch.Tensor, save: tuple | None = None) -> None:
        """index: [B] int64, for each pending request the token after which to keep the state
        (0 = after the first token of the window). save: (batch_idx, token_idx, block_ids) pending
        states to store as block boundary states (the caller passes accepted tokens only). No-op
        without a pending window."""
        if self.pending_rows is None:
            return
        if save is not None:
            self.save_window_blocks(save)
        self.commit_window(index)
        self.clear_pending()

    def save_window_blocks(self, save: tuple) -> None:
        """Store the pending window's states at (batch_idx, token_idx) [S] as the boundary states
        of block_ids [S]; call before commit_window (it reads the states before the window)."""
        bi, ti, blocks = save
        if self.block_ssm is None or blocks.numel() == 0:
            return
        before = self.ssm[self.pending_rows[bi]]
        self.save_blocks(blocks, self.pending_conv[bi, ti], self.pending_window.state_at(before, bi, ti))

    def commit_window(self, index: torch.Tensor) -> None:
        """The tensor work of `commit` (no host sync, so engine.compile compiles it): the rows'
        conv and delta-rule states become those after token index[b] of their window."""
        b = torch.arange(index.numel(), device=index.device)
        rows = self.pending_rows
        before = self.ssm[rows]                               # a copy: the states before the window
        self.conv.index_copy_(0, rows, self.pending_conv[b, index])
        self.ssm.index_copy_(0, rows, self.pending_window.state_at(before, b, index).to(self.ssm.dtype))

    def clear_pending(self) -> None:
        self.pending_conv = self.pending_window = self.pending_rows = None

    def save_rows(self, rows: torch.Tensor, block_ids: torch.Tensor) -> None:
        """Store the current states of rows [S] as the boundary states of block_ids [S] (after a
        one-token decode forward, whose token is always kept)."""
        self.save_blocks(block_ids, self.conv[rows], self.ssm[rows])

    def reset(self, row: int) -> None:
        self.conv[row].zero_()
        self.ssm[row].zero_()
