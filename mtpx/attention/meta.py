"""Per-forward metadata shared by every layer: where each token sits, which batch slot (row) holds
its recurrent state and token buffer, and which paged-KV slots hold its keys and values."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ForwardMeta:
    """Metadata of one batched forward over a right-padded [B, T] token grid.

    positions: [B, T] int64, absolute position of each token (padding entries hold 0).
    valid: [B, T] bool, True for real tokens; padding tokens write no cache and change no state.
    rows: [B] int64, the batch slot of each request (recurrent state, token buffer).
    kv_len: keys to read from the attention cache = max position in the batch + 1; None for a
        static-shape forward (`static`): the keys span the whole block_table, which the caller
        sliced to a bucket of blocks (the compiled decode step, mtpx/engine/compiled.py).
    block_table: [B, max_blocks] int64, the paged-KV block ids of each request (vLLM's block table);
        position p of request b lives in slot block_table[b, p // block_size] * block_size
        + p % block_size of every attention layer's cache (target and draft modules alike).
    slot_mapping: [B, T] int64, that slot for each token of the grid (padding: slot of position 0,
        never written; in a static forward, the cache's pad slot, which padding writes and nothing
        reads).
    keep_states: Gated DeltaNet keeps what rebuilds its recurrent and conv state after any token
        of the forward (verification windows), so that a rejection selects a state instead of
        re-running the model.
    save_states: (batch_idx [S], token_idx [S], block_ids [S]) or None: Gated DeltaNet stores its
        state after token (batch_idx, token_idx) with paged block block_ids (prefix caching of
        hybrid models: the state at every full block boundary travels with the block).
    attn_backend, attn_plan: the attention backend of this forward and its plan, made once for
        every attention layer (mtpx.attention.backend); None: the torch reference.
    gdn_backend: the Gated DeltaNet kernels, "auto" | "torch" | "fla"
        (mtpx.models.gated_delta_rule; engine.gdn_backend).
    compile_regions: under torch.compile, each decoder layer of this (static) forward runs as a
        region compiled once per layer type and shape (mtpx.models.decoder.layer_region;
        engine.compile_regions).
    region: this forward runs inside such a region (layer_region sets it): custom ops there
        cannot mutate their inputs (torch 2.13), so Gated DeltaNet's decode op returns new state
        rows instead of writing them in place as it does eager and in a whole compiled graph.
    packed: [N] int64 or None: the ragged layout (`pack_valid`). The indices of the N real tokens
        in the flattened [B * T] grid, row-major. Set, the decoder's token-wise work (embedding,
        norms, projections, MLP, lm_head) runs on the [N, hidden] tokens alone, and only the
        token mixers (attention, the Gated DeltaNet conv and recurrence) see the grid (`unpack`,
        `pack`): a step costs its tokens, not B times its widest window (vLLM's flattened batch).
        A static (compiled) verification forward packs too, N a dynamic size of its graph.
    row_run: slice(a, a + B) when rows are the ascending run of batch slots a .. a + B - 1 (known
        on the host: mtpx.cache.state.ascending_run), so that Gated DeltaNet reads and writes
        their states as views instead of gathering them; None: gather (always under compile).
    packed_lengths: with `packed`, each request's number of real tokens (host ints), so that a
        layer can lay the packed tokens out by request without reading the device (Gated
        DeltaNet's packed prefill, mtpx.models.deltanet).
    memo: what layers derive once per forward from the fields above and share (index tensors of
        the packed layout), keyed by the deriving layer.
    """

    positions: torch.Tensor
    valid: torch.Tensor
    rows: torch.Tensor
    kv_len: int | None
    block_table: torch.Tensor | None = None
    block_size: int = 0
    slot_mapping: torch.Tensor | None = None
    keep_states: bool = False
    save_states: tuple | None = None
    attn_backend: object | None = None
    attn_plan: object | None = None
    gdn_backend: str = "auto"
    compile_regions: bool = False
    region: bool = False
    packed: torch.Tensor | None = None
    row_run: slice | None = None
    packed_lengths: list[int] | None = None
    memo: dict = field(default_factory=dict)

    def planned(self, backend) -> "ForwardMeta":
        """Attach `backend` and its plan for this forward (once, before the layers run)."""
        self.attn_backend, self.attn_plan = backend, backend.plan(self)
        return self

    @property
    def static(self) -> bool:
        """Fixed shapes, no host sync (kv_len None): the compiled decode step's metadata."""
        return self.kv_len is None

    @staticmethod
    def build(starts: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor,
              block_table: torch.Tensor | None = None, block_size: int = 0,
              keep_states: bool = False, num_tokens: int | None = None,
              pad_slot: int | None = None) -> "ForwardMeta":
        """Request b covers positions starts[b] .. starts[b] + lengths[b] - 1 (all [B] int64);
        block_table [B, max_blocks] (None: no attention cache, e.g. DeltaNet-only tests).

        num_tokens, pad_slot (both or neither): a static forward: the grid has num_tokens columns
        whatever the lengths (each length must be <= num_tokens), padding tokens map to slot
        pad_slot, and kv_len is None (the keys span block_table); nothing reads a tensor's value
        on the host, so building it never synchronizes with the device."""
        static = num_tokens is not None
        T = num_tokens if static else (int(lengths.max()) if lengths.numel() else 0)
        t = torch.arange(T, device=starts.device)
        valid = t[None, :] < lengths[:, None]
        positions = torch.where(valid, starts[:, None] + t[None, :], 0)
        slots = None
        if block_table is not None:
            slots = block_table.gather(1, positions // block_size) * block_size + positions % block_size
            if static:
                slots = torch.where(valid, slots, pad_slot)
        if static:
            kv_len = None
        else:
            kv_len = int((starts + lengths).max()) if lengths.numel() else 0
        return ForwardMeta(positions, valid, rows, kv_len, block_table, block_size, slots, keep_states)

    def select(self, idx: torch.Tensor) -> "ForwardMeta":
        """The metadata of a subset of the requests (idx: [B'] int64 batch indices); save_states
        and packed are dropped (they refer to the full batch); the attention backend plans the
        subset anew."""
        pick = lambda x: None if x is None else x[idx]  # noqa: E731
        sub = ForwardMeta(self.positions[idx], self.valid[idx], self.rows[idx], self.kv_len,
                          pick(self.block_table), self.block_size, pick(self.slot_mapping),
                          self.keep_states, gdn_backend=self.gdn_backend)
        return sub if self.attn_backend is None else sub.planned(self.attn_backend)

    def pack_valid(self, lengths: list[int] | None = None, num_tokens: int | None = None) -> "ForwardMeta":
        """Use the ragged layout (`packed`) for this forward. lengths: each request's real tokens
        when the host knows them (no device read; requests beyond them are padding rows); None
        reads meta.valid. num_tokens: pack this many tokens (a static forward's token grid, at
        least the real ones): the extra entries are distinct padding positions of the grid, whose
        results are never read. A static forward keeps no packed_lengths (the compiled graph
        would guard on every list)."""
        B, T = self.positions.shape
        if lengths is None:
            idx = self.valid.flatten().nonzero()[:, 0]
            lengths = self.valid.sum(1).tolist()
        else:
            flat = [b * T + t for b, n in enumerate(lengths) for t in range(n)]
            if num_tokens is not None and num_tokens > len(flat):
                own = list(lengths) + [0] * (B - len(lengths))
                pad = (b * T + t for b in range(B) for t in range(own[b], T))
                flat += [next(pad) for _ in range(num_tokens - len(flat))]
            idx = torch.tensor(flat, dtype=torch.long, device=self.positions.device)
        self.packed = idx
        self.packed_lengths = None if self.static else list(lengths)
        return self

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] -> [N, ...]: the real tokens of the grid (`packed`)."""
        return x.flatten(0, 1).index_select(0, self.packed)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [B, T, ...]: the packed tokens back on the grid, zeros elsewhere."""
        B, T = self.positions.shape
        out = x.new_zeros(B * T, *x.shape[1:])
        return out.index_copy_(0, self.packed, x).view(B, T, *x.shape[1:])

    @property
    def lengths(self) -> torch.Tensor:
        return self.valid.sum(1)

    @property
    def ends(self) -> torch.Tensor:
        """[B] one past each request's last position in this forward."""
        return self.positions[:, 0] + self.lengths
