"""All tensor state of one engine: the paged KV caches of the target's attention layers and of every
MTP module, the Gated DeltaNet states per batch slot (and per block boundary with prefix caching),
the token buffer and the block tables.

Block ids come from whoever owns the blocks: the engine's KVCacheManager (paged, prefix caching),
or `static_block_tables()` for tests and tools that want the contiguous layout (each row owns a
fixed run of blocks, which is the contiguous cache as one allocator of the same code path).
"""
from __future__ import annotations

import heapq

import torch

from mtpx.attention.backend import get_backend
from mtpx.attention.kv_cache import KVCache
from mtpx.attention.meta import ForwardMeta
from mtpx.cache.state import KVCacheSpec, RecurrentState, RecurrentStateGroup, RecurrentStateSpec


def put_rows(t: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> None:
    """t[rows, cols] = values for a contiguous t [R, C, ...] (rows, cols: int64 of one shape S;
    values: [*S, ...]) as one index_copy_ on the flat view: its source never broadcasts, so
    under torch.compile it adds no guard on a batch != 1 (a batch of one runs in the graph of
    larger batches, mtpx/engine/compiled.py). Repeated (row, col) pairs keep one of their values:
    callers repeat only the pad row."""
    flat = t.view(-1, *t.shape[2:])
    flat.index_copy_(0, (rows * t.shape[1] + cols).reshape(-1), values.reshape(-1, *t.shape[2:]).to(t.dtype))


def kv_bytes_per_block(model, block_size: int, num_draft_modules: int,
                       boundary_states: bool) -> int:
    """Bytes one paged block costs across every attention layer (target + draft modules), plus
    the Gated DeltaNet boundary states stored with it when `boundary_states`. model: anything
    with cache_specs() and parameters() (MTPForCausalLM)."""
    size = next(model.parameters()).element_size()
    target, draft = model.cache_specs(num_draft_modules)
    total = 0
    for spec in target + draft:
        if isinstance(spec, KVCacheSpec):
            total += 2 * block_size * spec.num_kv_heads * spec.head_dim * size
        elif boundary_states:
            total += spec.bytes_per_state(size)
    return total


class ModelCache:
    """model: anything with cache_specs() and parameters() (MTPForCausalLM: each layer declares
    its cache, KVCacheSpec or RecurrentStateSpec, and the cache is built from those); rows: batch
    slots (max concurrent requests); max_len: positions per request (prompt + output + drafts);
    num_blocks x block_size: the paged KV pool; boundary_states: keep the Gated DeltaNet state of
    every full block (prefix caching on a hybrid model); attention_backend, gdn_backend: the
    kernels every forward's metadata carries (EngineConfig's fields); compile_regions: static
    metadata asks for compiled decoder-layer regions (ForwardMeta.compile_regions).

    target: one cache per target layer (KVCache or RecurrentState); draft: one KVCache per MTP module.
    recurrent_groups: the Gated DeltaNet states stacked per RecurrentStateSpec (one group for a
    Qwen3-Next-style model), whose commit after verification is one set of ops for every layer.
    tokens: [rows + 1, max_len] int64: a request's known tokens at [0, num_tokens); the slots
    after them are scratch where the speculator writes its drafts. `write_tokens` is its one
    writer.
    block_tables: [rows + 1, ceil(max_len / block_size)] int64, the block ids of each row's request.

    Padding (the static-shape decode step, mtpx/engine/compiled.py, pads its batch to a capture
    size): one extra batch slot `pad_row` = rows (recurrent state, token buffer, block table; never
    handed out) and one extra KV block `pad_block` = num_blocks whose slots (`pad_slot` onwards)
    take the writes of padding tokens. The pad row's block table points at the pad block only, so
    padding never reads or writes a block of a real request.
    """

    def __init__(self, model, rows: int, max_len: int, num_draft_modules: int,
                 block_size: int = 16, num_blocks: int | None = None, boundary_states: bool = False,
                 attention_backend: str = "torch", gdn_backend: str = "auto", compile_regions: bool = False):
        p = next(model.parameters())
        self.compile_regions = compile_regions
        dtype, device = p.dtype, p.device
        target_specs, draft_specs = model.cache_specs(num_draft_modules)
        attn = next((s for s in target_specs + draft_specs if isinstance(s, KVCacheSpec)), None)
        self.rows, self.max_len, self.block_size = rows, max_len, block_size
        self.gdn_backend = gdn_backend
        self.attention_backend = get_backend(attention_backend, device, None if attn is None else (
            attn.num_heads, attn.num_kv_heads, attn.head_dim, dtype))
        self.max_blocks = -(-max_len // block_size)
        self.num_blocks = rows * self.max_blocks if num_blocks is None else num_blocks
        self.pad_row, self.pad_block = rows, self.num_blocks
        self.pad_slot = self.num_blocks * block_size

        def kv(spec):
            return KVCache.allocate(self.num_blocks + 1, block_size, spec.num_kv_heads, spec.head_dim,
                                    dtype, device)

        # Gated DeltaNet layers of one spec share stacked states (one commit for all of them)
        layers_of: dict[RecurrentStateSpec, list[int]] = {}
        for i, spec in enumerate(target_specs):
            if isinstance(spec, RecurrentStateSpec):
                layers_of.setdefault(spec, []).append(i)
        self.recurrent_groups = [
            RecurrentStateGroup.allocate(len(idx), rows + 1, spec, dtype, device,
                                         self.num_blocks + 1 if boundary_states else 0)  # + pad block
            for spec, idx in layers_of.items()]
        self.target = [kv(spec) if isinstance(spec, KVCacheSpec) else None for spec in target_specs]
        for group, idx in zip(self.recurrent_groups, layers_of.values()):
            for i, state in zip(idx, group.layers):
                self.target[i] = state
        self.draft = [kv(spec) for spec in draft_specs]
        self.tokens = torch.zeros(rows + 1, max_len, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(rows + 1, self.max_blocks, dtype=torch.long, device=device)
        self.block_tables[self.pad_row] = self.pad_block
        self._free = list(range(rows))     # a heap: the lowest free slot goes first (allocate_row)
        self._num_synced = [0] * rows      # block-table entries already copied, per row

    @property
    def recurrent(self) -> list[RecurrentState]:
        return [c for c in self.target if isinstance(c, RecurrentState)]

    @property
    def kv_caches(self) -> list[KVCache]:
        return [c for c in self.target if isinstance(c, KVCache)] + self.draft

    def static_block_tables(self) -> "ModelCache":
        """Give row r the blocks [r * max_blocks, (r + 1) * max_blocks): the contiguous layout."""
        if self.num_blocks < self.rows * self.max_blocks:
            raise ValueError("static block tables need rows * ceil(max_len / block_size) blocks")
        self.block_tables[: self.rows] = torch.arange(self.rows * self.max_blocks).view(self.rows, -1)
        return self

    def meta(self, starts: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor,
             keep_states: bool = False) -> ForwardMeta:
        """ForwardMeta for requests in `rows` covering [starts, starts + lengths) (all [B]),
        planned by this cache's attention backend (`attention_backend`, default the torch one)."""
        meta = ForwardMeta.build(starts, lengths, rows, self.block_tables[rows], self.block_size,
                                 keep_states)
        meta.gdn_backend = self.gdn_backend
        return meta if self.attention_backend is None else meta.planned(self.attention_backend)

    def static_meta(self, starts: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor,
                    num_tokens: int, num_blocks: int, keep_states: bool = False) -> ForwardMeta:
        """A static-shape ForwardMeta (ForwardMeta.build with num_tokens): a [B, num_tokens] grid
        whose padding writes go to the pad slot, reading the first num_blocks blocks of each row
        (every position of the forward must lie below num_blocks * block_size). Planned by the
        attention backend like `meta`; builds without a host sync (with the torch backend)."""
        meta = ForwardMeta.build(starts, lengths, rows, self.block_tables[rows, :num_blocks],
                                 self.block_size, keep_states, num_tokens, self.pad_slot)
        meta.gdn_backend, meta.compile_regions = self.gdn_backend, self.compile_regions
        return meta if self.attention_backend is None else meta.planned(self.attention_backend)

    def write_tokens(self, rows: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> None:
        """tokens[rows, positions] = ids (rows [B] or the shape of positions; positions and ids of
        one shape S, int64), through put_rows: no shape depends on a value, so the compiled step
        calls it too; entries aimed at the pad row are scratch."""
        if rows.dim() < positions.dim():
            rows = rows.reshape(*rows.shape, *[1] * (positions.dim() - rows.dim())).expand_as(positions)
        put_rows(self.tokens, rows, positions, ids)

    def num_free_rows(self) -> int:
        return len(self._free)

    def allocate_row(self) -> int:
        """Take the lowest free batch slot and clear its recurrent state: requests admitted
        together get an ascending run of slots, whose Gated DeltaNet states a forward reads and
        writes in place (ForwardMeta.row_run). Raises RuntimeError when none is free."""
        if not self._free:
            raise RuntimeError("no free batch slot: the engine admitted more than max_num_seqs requests")
        row = heapq.heappop(self._free)
        self._num_synced[row] = 0
        for g in self.recurrent_groups:
            g.reset(row)
        return row

    def free_row(self, row: int) -> None:
        heapq.heappush(self._free, row)

    def set_block_table(self, row: int, blocks: list[int]) -> None:
        """Copy a request's block ids (from the KV cache manager, which only appends to a running
        request's table) into its row; only the entries added since the last call are copied."""
        if len(blocks) > self.max_blocks:
            raise ValueError(f"{len(blocks)} blocks exceed the row's {self.max_blocks}")
        done = self._num_synced[row]
        if len(blocks) > done:
            self.block_tables[row, done: len(blocks)] = torch.tensor(
                blocks[done:], device=self.block_tables.device)
            self._num_synced[row] = len(blocks)

    def commit_recurrent(self, index: torch.Tensor, save: tuple | None = None) -> None:
        """After a keep_states verification forward: keep the state after token index[b] ([B]
        int64); store the boundary states `save` = (batch_idx, token_idx, block_ids) first. No-op
        without pending windows."""
        if save is not None:
            for c in self.recurrent:
                c.save_window_blocks(save)
        self.commit_windows(index)
        self.clear_pending()

    def commit_windows(self, index: torch.Tensor) -> None:
        """The tensor work of commit_recurrent (no host sync: engine.compile compiles it)."""
        for g in self.recurrent_groups:
            g.commit(index)

    def clear_pending(self) -> None:
        for g in self.recurrent_groups:
            g.clear_pending()

    def reserve_windows(self, max_len: int) -> None:
        """Allocate the Gated DeltaNet window buffers for verification windows of up to max_len
        tokens (RecurrentStateGroup.reserve_windows); eager forwards allocate on demand."""
        for g in self.recurrent_groups:
            g.reserve_windows(max_len)

    def save_recurrent_rows(self, rows: torch.Tensor, block_ids: torch.Tensor) -> None:
        """Store the current Gated DeltaNet states of rows [S] as boundary states of block_ids [S]."""
        for c in self.recurrent:
            c.save_rows(rows, block_ids)
