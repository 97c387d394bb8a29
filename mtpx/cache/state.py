"""Per-layer inference state: what each layer declares it needs (KVCacheSpec for attention,
RecurrentStateSpec for Gated DeltaNet; ModelCache builds from them) and the recurrent state of
Gated DeltaNet layers. The paged KV cache itself is the attention package's
(mtpx.attention.kv_cache.KVCache). Recurrent states are indexed by the request's batch slot (row); with prefix
caching on a hybrid model, the state at every full block boundary is also stored per block so that a prefix
hit can resume from it. The layers of one spec keep their states stacked (RecurrentStateGroup).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mtpx.kernels import torch_ops


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
        return (self.conv_dim * (self.kernel - 1) * element_size
                + self.heads * self.key_dim * self.value_dim * 4)


def ascending_run(rows: list[int]) -> slice | None:
    """slice(a, a + B) when the host list of batch slots rows is an ascending run a, a + 1, ...,
    a + B - 1 with B > 1, else None: the forwards over it read and write the Gated DeltaNet states
    of those slots as views (ForwardMeta.row_run)."""
    if len(rows) > 1 and rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return None


def read_rows(t: torch.Tensor, rows: torch.Tensor, run: slice | None = None) -> torch.Tensor:
    """t[rows] for t [R, ...] and rows [B] int64: the view t[run] when run (ascending_run of the
    same slots) is given outside torch.compile (writing it writes t), else a copy (index_select)."""
    return t.index_select(0, rows) if run is None or torch.compiler.is_compiling() else t[run]


def write_rows(t: torch.Tensor, rows: torch.Tensor, value: torch.Tensor, run: slice | None = None) -> None:
    """t[rows] := value ([B, ...], cast to t's dtype); nothing to do when value is already
    read_rows(t, rows, run)'s view (updated in place)."""
    if run is None or torch.compiler.is_compiling():
        t.index_copy_(0, rows, value.to(t.dtype))
        return
    view = t[run]
    if value.data_ptr() != view.data_ptr() or value.shape != view.shape or value.stride() != view.stride():
        view.copy_(value)


@dataclass
class WindowStates:
    """A verification window's Gated DeltaNet states, kept in chunked form instead of one
    [Dk, Dv] state per token: the state after window token t of row b is

        S_t = exp(G_t) S_0 + sum_{j <= t} exp(G_t - G_j) k_j v_new_j^T

    (the chunked form's state update, mtpx.models.gated_delta_rule, applied to the prefix 0..t;
    exact because the WY factors are lower triangular, so v_new_j reads tokens <= j only).

    k: [..., B, H, T, Dk] L2-normalised keys; v_new: [..., B, H, T, Dv]; G: [..., B, H, T]
    cumulative log decay; all float32 (float64 for float64 inputs). The leading dims are empty
    for one layer and [L] for the layers of a RecurrentStateGroup stacked.
    """

    k: torch.Tensor
    v_new: torch.Tensor
    G: torch.Tensor

    def state_at(self, initial_state: torch.Tensor, batch_idx: torch.Tensor,
                 token_idx: torch.Tensor) -> torch.Tensor:
        """The state after token token_idx[i] of row batch_idx[i] (both [N] int64), from those
        rows' states before the window, initial_state [..., N, H, Dk, Dv] -> [..., N, H, Dk, Dv]."""
        rows = WindowStates(self.k[..., batch_idx, :, :, :], self.v_new[..., batch_idx, :, :, :],
                            self.G[..., batch_idx, :, :])
        return rows.state_after(initial_state, token_idx)

    def _decay_and_keys(self, token_idx: torch.Tensor):
        """(exp(G_t) [..., B, H, 1, 1], the window's keys weighted by exp(G_t - G_j) for j <= t and
        0 after [..., B, H, T, Dk]), t = token_idx [B]: S_t = exp(G_t) S_0 + kw^T v_new."""
        G = self.G
        B, H, T = G.shape[-3:]
        at = token_idx.view(B, 1, 1)
        G_t = G.gather(-1, at.expand(*G.shape[:-1], 1))                             # [..., B, H, 1]
        upto = torch.arange(T, device=G.device) <= at                               # [B, 1, T]
        return G_t.exp()[..., None], self.k * torch.where(upto, (G_t - G).exp(), 0)[..., None]

    def state_after(self, initial_state: torch.Tensor, token_idx: torch.Tensor) -> torch.Tensor:
        """state_at for every row b in order (token_idx: [B] int64; initial_state
        [..., B, H, Dk, Dv]), without gathering the window's rows.

        Compiled (torch.compiler.is_compiling), the sum over the window's T tokens is written as
        a reduction, which Inductor fuses with the decay of the initial state: one pass over the
        states. Eager, it is a batched matmul (the reduction would materialize T states)."""
        decay, kw = self._decay_and_keys(token_idx)
        if torch.compiler.is_compiling():
            update = (kw[..., None] * self.v_new[..., None, :]).sum(-3)
        else:
            update = kw.transpose(-1, -2) @ self.v_new
        return decay * initial_state.to(self.G.dtype) + update

    def advance_(self, state: torch.Tensor, token_idx: torch.Tensor) -> None:
        """state_after written into `state` (contiguous, [..., B, H, Dk, Dv] in G's dtype, the
        states before the window; the caller's own copy): one scaling and one batched
        multiply-add in place, without the two state-sized temporaries of state_after (at batch
        64 the commit moved about 9 state-sized passes per layer). Eager only."""
        decay, kw = self._decay_and_keys(token_idx)
        T, Dk, Dv = kw.shape[-2], *state.shape[-2:]
        state.mul_(decay)
        state.view(-1, Dk, Dv).baddbmm_(kw.transpose(-1, -2).reshape(-1, Dk, T),
                                        self.v_new.reshape(-1, T, Dv))


@dataclass
class RecurrentState:
    """Gated DeltaNet state of every batch slot for one layer: views into the stacked tensors of
    its RecurrentStateGroup (all the layers of one spec), so that the commit after verification
    is a few batched ops over every layer instead of a few per layer.

    conv: [rows, conv_dim, kernel - 1], the last kernel-1 inputs of the short causal conv
        (group.conv[layer]).
    ssm: [rows, heads, key_dim, value_dim], the delta-rule memory (float32, float64 in fp64
        models; group.ssm[layer]).
    block_conv, block_ssm: [num_blocks, ...] or None: the state after the last token of each full
        paged block (prefix caching of hybrid models).
    After a forward with keep_states (a verification window, `keep_window`), for `pending_rows`:
    `pending_conv` [B, T, conv_dim, K-1] the conv window after every token and `pending_window`
    the delta-rule window in chunked form (WindowStates, from window_gated_delta_rule), both read
    from the group's window buffers; the group's `commit(index)` builds the state after the
    accepted token of each request from them (invariant 3: a rejection selects a state, never
    re-runs the model).
    """

    group: "RecurrentStateGroup" = field(repr=False)
    layer: int
    block_conv: torch.Tensor | None = None
    block_ssm: torch.Tensor | None = None

    @property
    def conv(self) -> torch.Tensor:
        return self.group.conv[self.layer]

    @property
    def ssm(self) -> torch.Tensor:
        return self.group.ssm[self.layer]

    @property
    def pending_rows(self) -> torch.Tensor | None:
        return self.group.pending_rows

    @property
    def pending_window(self) -> WindowStates | None:
        """This layer's kept window ([B, H, T, ...], gathered from the group's buffers), or None."""
        g = self.group
        if g.pending_rows is None:
            return None
        k, v_new, G, _ = g.windows(g.pending_len)
        rows, i = g.pending_rows, self.layer
        return WindowStates(k[i, rows], v_new[i, rows], G[i, rows])

    @property
    def pending_conv(self) -> torch.Tensor | None:
        """[B, T, conv_dim, K-1]: the conv window after each kept token, or None."""
        g = self.group
        if g.pending_rows is None:
            return None
        K1 = g.conv.shape[-1]
        ext = g.windows(g.pending_len)[3][self.layer, g.pending_rows]
        return ext.unfold(-1, K1, 1)[:, :, 1:].transpose(1, 2)

    def keep_window(self, rows: torch.Tensor, window: WindowStates, ext: torch.Tensor,
                    run: slice | None = None) -> None:
        """Keep a verification window for the group's commit: rows [B] (batch slots; run: their
        ascending_run or None), window (from window_gated_delta_rule, [B, H, T, ...]) and ext
        [B, conv_dim, K-1+T], the conv inputs (the K-1 before the window, then the window's).
        Copied into the group's window buffers."""
        self.group.keep(self.layer, rows, window, ext, run)

    def views(self, window_len: int = 0) -> tuple:
        """This layer's state tensors as views of the group's: (conv, ssm, window_k, window_v_new,
        window_G, window_ext), the window buffers [rows, ...] reserved for window_len tokens
        first (None when 0 and none are reserved). LayerStates(*views) is what a compiled
        decoder-layer region runs on (mtpx.models.decoder); mark_kept records its kept window."""
        g, i = self.group, self.layer
        if window_len:
            g.reserve_windows(window_len)
            buffers = g.windows(window_len)
        else:
            buffers = (g.window_k, g.window_v_new, g.window_G, g.window_ext)
        return (g.conv[i], g.ssm[i], *(None if b is None else b[i] for b in buffers))

    def mark_kept(self, rows: torch.Tensor, window_len: int) -> None:
        """After a keep_states forward through views(): rows [B] hold a kept window of window_len
        tokens (what keep_window records)."""
        self.group.pending_rows, self.group.pending_len, self.group.pending_run = rows, window_len, None

    @staticmethod
    def allocate(rows: int, conv_dim: int, kernel: int, heads: int, key_dim: int, value_dim: int,
                 dtype, device="cpu", num_blocks: int = 0) -> "RecurrentState":
        """One layer's state (a group of one); num_blocks > 0 also allocates the per-block
        boundary states."""
        spec = RecurrentStateSpec(conv_dim, kernel, heads, key_dim, value_dim)
        return RecurrentStateGroup.allocate(1, rows, spec, dtype, device, num_blocks).layers[0]

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

    def save_window_blocks(self, save: tuple) -> None:
        """Store the pending window's states at (batch_idx, token_idx) [S] as the boundary states
        of block_ids [S]; call before the group's commit (it reads the states before the window).
        No-op without a pending window."""
        bi, ti, blocks = save
        if self.pending_rows is None or self.block_ssm is None or blocks.numel() == 0:
            return
        before = self.ssm[self.pending_rows[bi]]
        self.save_blocks(blocks, self.pending_conv[bi, ti], self.pending_window.state_at(before, bi, ti))

    def save_rows(self, rows: torch.Tensor, block_ids: torch.Tensor) -> None:
        """Store the current states of rows [S] as the boundary states of block_ids [S] (after a
        one-token decode forward, whose token is always kept)."""
        self.save_blocks(block_ids, self.conv[rows], self.ssm[rows])


def _prefix_view(buffer: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The first prod(shape) elements of a contiguous buffer, viewed as `shape` (contiguous)."""
    n = 1
    for d in shape:
        n *= d
    return buffer.view(-1)[:n].view(shape)


def write_window(window_k: torch.Tensor, window_v_new: torch.Tensor, window_G: torch.Tensor,
                 window_ext: torch.Tensor, rows: torch.Tensor, window: WindowStates,
                 ext: torch.Tensor) -> None:
    """One layer's window buffers ([rows, H, W, ...], [rows, C, K-1+W], W >= T; the views of
    RecurrentStateGroup.windows(T) have W = T) at `rows` [B] := the window [B, H, T, ...] and
    conv inputs ext [B, C, K-1+T]."""
    T = window.G.shape[-1]
    # by batch slot, with index_copy_: a sliced assignment [:B] could broadcast a batch of one
    # and a slice of a symbolic length makes Inductor guard on B >= 2 (a batch of one shares
    # the batch-2 graphs); padding rows all write the pad row
    window_k[:, :, :T].index_copy_(0, rows, window.k)
    window_v_new[:, :, :T].index_copy_(0, rows, window.v_new)
    window_G[:, :, :T].index_copy_(0, rows, window.G)
    window_ext[:, :, : ext.shape[-1]].index_copy_(0, rows, ext.to(window_ext.dtype))


def _write_window_layer(window_k, window_v_new, window_G, window_ext, layer, rows, k, v_new, G, ext) -> None:
    write_window(window_k[layer], window_v_new[layer], window_G[layer], window_ext[layer], rows,
                 WindowStates(k, v_new, G), ext)


torch_ops.define("write_window_(Tensor(a!) window_k, Tensor(b!) window_v_new, Tensor(c!) window_G, "
                 "Tensor(d!) window_ext, int layer, Tensor rows, Tensor k, Tensor v_new, Tensor G, "
                 "Tensor ext) -> ()",
                 _write_window_layer, lambda *args: None, any_device=True)


@dataclass
class LayerStates:
    """One Gated DeltaNet layer's state as plain tensors (RecurrentState.views): what a compiled
    decoder-layer region reads and writes, touching no Python state of the group (the caller
    records a kept window with RecurrentState.mark_kept). conv [rows, C, K-1]; ssm [rows, H, Dk,
    Dv]; window_*: the layer's window buffers. No boundary states: a region's forward stores
    none (block_conv, block_ssm None)."""

    conv: torch.Tensor
    ssm: torch.Tensor
    window_k: torch.Tensor | None
    window_v_new: torch.Tensor | None
    window_G: torch.Tensor | None
    window_ext: torch.Tensor | None
    block_conv = None
    block_ssm = None

    def keep_window(self, rows: torch.Tensor, window: WindowStates, ext: torch.Tensor,
                    run: slice | None = None) -> None:
        """RecurrentState.keep_window's writes (the buffers must hold the window; run: unused, a
        compiled region gathers)."""
        write_window(self.window_k, self.window_v_new, self.window_G, self.window_ext, rows, window, ext)


@dataclass
class RecurrentStateGroup:
    """The Gated DeltaNet states of L layers with one RecurrentStateSpec, stacked.

    conv: [L, rows, conv_dim, kernel - 1] in the model dtype; ssm: [L, rows, heads, key_dim,
    value_dim] float32 (float64 in fp64 models); layers: the L RecurrentStates, layer i viewing
    conv[i] and ssm[i].

    Window buffers (the last verification window of every layer, so that the commit reads a few
    stacked tensors instead of 4 L per-layer ones; allocated by `reserve_windows`, or on first use
    eager): window_k [L, rows, H, W, Dk], window_v_new [L, rows, H, W, Dv], window_G [L, rows, H, W]
    in ssm's dtype, window_ext [L, rows, conv_dim, K-1+W] in conv's; W the longest window; a
    T-token window is kept in `windows(T)`, contiguous views of their first elements. The
    window of a request sits at its batch slot; pending_rows [B] (the batch slots, padding rows
    at the pad slot) and pending_len T describe the kept one (pending_rows None: none kept).
    """

    conv: torch.Tensor
    ssm: torch.Tensor
    layers: list[RecurrentState]
    window_k: torch.Tensor | None = None
    window_v_new: torch.Tensor | None = None
    window_G: torch.Tensor | None = None
    window_ext: torch.Tensor | None = None
    pending_rows: torch.Tensor | None = None
    pending_run: slice | None = None      # pending_rows' ascending_run (eager), or None
    pending_len: int = 0
    slice_bytes = 2 << 20   # eager commit: layers per pass, by their states' size (commit)
    # T -> windows(T), eager; reset with the buffers
    _windows: dict = field(default_factory=dict, repr=False)

    @staticmethod
    def allocate(num_layers: int, rows: int, spec: RecurrentStateSpec, dtype, device="cpu",
                 num_blocks: int = 0) -> "RecurrentStateGroup":
        """Zero states for num_layers layers of `spec`; num_blocks > 0 also allocates each layer's
        per-block boundary states."""
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        conv_shape = (spec.conv_dim, spec.kernel - 1)
        ssm_shape = (spec.heads, spec.key_dim, spec.value_dim)
        group = RecurrentStateGroup(torch.zeros(num_layers, rows, *conv_shape, dtype=dtype, device=device),
                                    torch.zeros(num_layers, rows, *ssm_shape, dtype=state_dtype,
                                                device=device), [])
        blocks = num_blocks > 0
        for i in range(num_layers):
            group.layers.append(RecurrentState(
                group, i,
                torch.zeros(num_blocks, *conv_shape, dtype=dtype, device=device) if blocks else None,
                torch.zeros(num_blocks, *ssm_shape, dtype=state_dtype, device=device) if blocks else None))
        return group

    @property
    def window_capacity(self) -> int:
        """The longest window the buffers hold (0 before any is allocated)."""
        return 0 if self.window_G is None else self.window_G.shape[-1]

    def reserve_windows(self, max_len: int) -> None:
        """Allocate window buffers for windows of up to max_len tokens (no-op when they hold
        that many). Raises RuntimeError when called for more inside torch.compile (engine.compile
        reserves the longest window before compiling)."""
        if max_len <= self.window_capacity:
            return
        if torch.compiler.is_compiling():
            raise RuntimeError(f"a {max_len}-token window exceeds the reserved {self.window_capacity}: "
                               "call ModelCache.reserve_windows before compiling")
        L, rows, H, Dk, Dv = self.ssm.shape
        like = {"dtype": self.ssm.dtype, "device": self.ssm.device}
        self._windows.clear()
        self.window_k = torch.zeros(L, rows, H, max_len, Dk, **like)
        self.window_v_new = torch.zeros(L, rows, H, max_len, Dv, **like)
        self.window_G = torch.zeros(L, rows, H, max_len, **like)
        self.window_ext = torch.zeros(L, rows, self.conv.shape[2], self.conv.shape[3] + max_len,
                                      dtype=self.conv.dtype, device=self.conv.device)

    def windows(self, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The window buffers laid out for windows of T <= window_capacity tokens, each contiguous:
        (k [L, rows, H, T, Dk], v_new [L, rows, H, T, Dv], G [L, rows, H, T], ext [L, rows,
        conv_dim, K-1+T]), views of the first elements of each buffer. Writing and reading a
        T-token window then never strides over the W - T slots it does not use (an engine with
        automatic k holds buffers for its widest window; its k = 4 steps gathered and scattered
        strided [..., :5] slices, up to 4% of the step at batch 16). A window kept at T is read at T:
        it lives from the verification to the commit of one step. Eager, the views are built once
        per T (keep asks for them once per layer and step)."""
        if not torch.compiler.is_compiling() and T in self._windows:
            return self._windows[T]
        L, rows, H, _, Dk = self.window_k.shape
        Dv, C, K1 = self.window_v_new.shape[-1], self.window_ext.shape[2], self.conv.shape[3]
        shapes = ((L, rows, H, T, Dk), (L, rows, H, T, Dv), (L, rows, H, T), (L, rows, C, K1 + T))
        views = tuple(_prefix_view(w, shape) for w, shape in
                      zip((self.window_k, self.window_v_new, self.window_G, self.window_ext), shapes))
        if not torch.compiler.is_compiling():
            self._windows[T] = views
        return views

    def keep(self, layer: int, rows: torch.Tensor, window: WindowStates, ext: torch.Tensor,
             run: slice | None = None) -> None:
        """RecurrentState.keep_window for layer `layer` (its contract). Under torch.compile (a
        whole graph; a layer region writes its LayerStates) through the operator
        mtpx::write_window_, which writes the stacked buffers in place: index_copy_ into a layer's
        view of them would be scattered back into every layer's buffers, once per layer."""
        T = window.G.shape[-1]
        self.reserve_windows(T)
        if torch.compiler.is_compiling():
            torch.ops.mtpx.write_window_(*self.windows(T), layer, rows, window.k, window.v_new, window.G, ext)
        else:
            write_window(*(w[layer] for w in self.windows(T)), rows, window, ext)
        self.pending_rows, self.pending_len, self.pending_run = rows, T, run

    def clear_pending(self) -> None:
        self.pending_rows = self.pending_run = None

    def commit(self, index: torch.Tensor) -> None:
        """After a keep_states forward of every layer: each pending row's conv and delta-rule
        states become those after token index[b] of its window (index: [B] int64, 0 = after the
        window's first token), for all layers in one set of batched ops over the window buffers
        (eager: in slices of layers whose states fit in `slice_bytes`, so that the pass stays in
        cache at large batch); the caller clears the pending windows. No host sync, so
        engine.compile compiles it. No-op without a pending window. Eager, when the rows are an
        ascending run of batch slots (pending_run), the delta-rule states are advanced in place, one
        layer at a time, without gathering and scattering them (the same values; the conv
        windows keep the gather: gathering the taps from the strided view was slower)."""
        rows = self.pending_rows
        if rows is None:
            return
        B, T = rows.shape[0], self.pending_len
        L, _, C, K1 = self.conv.shape
        window_k, window_v_new, window_G, window_ext = self.windows(T)
        at = index.view(1, B, 1, 1) + 1 + torch.arange(K1, device=index.device)      # conv window after
        run = None if torch.compiler.is_compiling() else self.pending_run
        step = L if torch.compiler.is_compiling() else max(
            1, self.slice_bytes // (B * self.ssm[0, 0].numel() * self.ssm.element_size()))
        for lo in range(0, L, step):
            # index_select, not w[lo: lo + step, rows]: the same gather, several times faster on
            # the CPU eager; per slice, so that no temporary is large (at batch 64 the conv
            # windows of all 24 layers at once were 8 MB, fresh pages every step:
            # experiments/step_costs/batch64_window)
            n = min(step, L - lo)
            ext = window_ext[lo: lo + step].index_select(1, rows)
            self.conv[lo: lo + step].index_copy_(1, rows, ext.gather(-1, at.expand(n, B, C, K1)))
            if run is not None:   # the delta-rule states in place, layer by layer (contiguous views)
                for i in range(lo, lo + n):
                    WindowStates(*(w[i, run] for w in (window_k, window_v_new, window_G))
                                 ).advance_(self.ssm[i, run], index)
                continue
            part = WindowStates(*(w[lo: lo + step].index_select(1, rows) for w in
                                  (window_k, window_v_new, window_G)))   # [step, B, H, T, ...]
            state = self.ssm[lo: lo + step].index_select(1, rows)   # a copy: the states before the window
            if torch.compiler.is_compiling():
                state = part.state_after(state, index)
            else:
                part.advance_(state, index)
            self.ssm[lo: lo + step].index_copy_(1, rows, state)

    def reset(self, row: int) -> None:
        self.conv[:, row].zero_()
        self.ssm[:, row].zero_()
