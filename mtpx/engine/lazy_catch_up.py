"""Lazy catch-up of the draft modules: a decode step that proposes no draft runs no module.

With automatic k most steps at a large batch propose nothing (k = 0), yet requests keep a draft
depth > 0 (their modules may draft again). A step without drafts runs the target alone, exactly
plain decoding's step (compiled: its 1-token verification graph); each request of depth > 0 falls
behind: its target hidden states h_j of the positions it verified are kept in a ring (`ring`,
[rows + 1, window, hidden], position j at j % window), and `Speculator.hold` marks the module
positions that read a rejected draft as not computed. When the request drafts again (or before its
ring would overflow) one prefill-like round without drafts (`Speculator.propose` on a dynamic
DraftBatch whose target_hidden comes from the ring, the same catch-up a prefill chunk runs) brings
every module of its depth over the positions it missed, batched over all rows that lag; the decode
step's own round then re-prefills as after any step (multi_module.py). Module KV stays exact
(docs/architecture.md, invariant 2); `Drafts.num_final` of a lagging row stops at its modules'
progress, so no block is published before its module KV is computed (invariant 4).

Host-side bookkeeping only (`behind`: batch slot -> first position module 1 has not computed,
known without reading a tensor); the ring is written and read with device indices.
"""
from __future__ import annotations

import time

import torch

from mtpx.cache.model_cache import ModelCache, put_rows
from mtpx.spec_decode.protocol import DraftBatch

CATCH_UP_WINDOW = 256   # positions a request may fall behind before a step catches it up anyway
NONE = 2 ** 62          # LazyCatchUp.final of a slot that does not lag: no bound


class LazyCatchUp:
    """The lag of each batch slot's draft modules and the target hidden states that fill it.

    speculator: a Speculator; cache: the runner's ModelCache; window: ring positions per slot
    (at least 2 x (num_speculative_tokens + 1)); now: the clock that times the catch-up rounds
    (seconds). Raises ValueError for a smaller window. `spent` holds this step's catch-up: (seconds,
    positions x modules), `begin_step` zeroes it.
    """

    def __init__(self, speculator, cache: ModelCache, window: int = CATCH_UP_WINDOW, now=time.perf_counter):
        if window < 2 * (speculator.num_speculative_tokens + 1):
            raise ValueError(f"lazy catch-up window={window}: needs at least "
                             "2 x (num_speculative_tokens + 1)")
        p = next(speculator.model.parameters())
        self.speculator, self.cache, self.window = speculator, cache, window
        self.ring = torch.zeros(cache.rows + 1, window, speculator.model.cfg.hidden_size,
                                dtype=p.dtype, device=p.device)
        # a lagging slot's Drafts.num_final (constant while it lags: its modules do not move); else NONE
        self.final = torch.full((cache.rows + 1,), NONE, dtype=torch.long, device=p.device)
        self.final_host: dict[int, int] = {}  # lagging slot -> its `final` (host copy, read every step)
        self._flat = self.ring.view(-1, self.ring.shape[-1])     # [(rows + 1) * window, hidden]
        self.behind: dict[int, int] = {}      # batch slot -> module 1's first position not computed
        self.depth: dict[int, int] = {}       # lagging slot -> the depth its `final` was taken at
        self.num_module_tokens = 0            # positions x modules the catch-up rounds ran (StepTiming)
        self.now, self.spent = now, (0.0, 0)

    def begin_step(self) -> None:
        """A new step: its catch-up time and positions x modules start at zero."""
        self.spent = (0.0, 0)

    def reset(self, row: int) -> None:
        """A slot freed or given to a new request: nothing behind."""
        if self.behind.pop(row, None) is not None:
            self.final[row] = NONE
        self.depth.pop(row, None)
        self.final_host.pop(row, None)

    def lagging(self, rows: list[int]) -> list[int]:
        """Indices into `rows` (batch slots) whose modules are behind."""
        return [b for b, row in enumerate(rows) if row in self.behind]

    def hold(self, rows: torch.Tensor, rows_host: list[int], depths: list[int], n_host: list[int],
             accepted: torch.Tensor, hidden: torch.Tensor, num_tokens: torch.Tensor,
             n: torch.Tensor | None = None) -> list[int]:
        """A step without drafts for the B requests in rows [B] (host copies rows_host, depths,
        n_host: each verification window's first position n; n: its device copy [>= B], or None):
        rows of depth > 0 fall behind (or further behind); one whose ring would overflow catches
        up over [behind, n) first; the target hidden states of the window's kept positions
        n .. n + accepted (hidden [B', T, H], accepted [B]) go to the ring. -> Drafts.num_final of
        each of the B rows, host ints (Speculator.hold; NONE: not lagging; num_tokens [B]: known
        tokens after the step).

        A slot already behind at the same depth only has its window written (one index_copy_
        for a 1-token window): its modules' marks and num_final do not change while it lags
        (`Speculator.hold` marks positions that read the step's rejected drafts, and a step
        without drafts verifies none for a lagging slot: it drafted nothing)."""
        B, T, W = len(rows_host), hidden.shape[1], self.window
        behind, held = self.behind, self.depth
        full, fresh = [], []
        for b in range(B):
            d, row = depths[b], rows_host[b]
            if not d:
                if row in held:                 # its depth fell to 0: its modules are never read again
                    self.reset(row)
                continue
            start = behind.get(row)
            if start is not None and n_host[b] + T - start > W:
                full.append(b)
            elif held.get(row) != d:
                fresh.append(b)
        if full:
            self.catch_up(rows, rows_host, depths, n_host, full)
            fresh = sorted(fresh + full)
        if fresh:
            idx = torch.tensor(fresh, device=rows.device)
            sub = rows[idx]
            depth = torch.tensor([depths[b] for b in fresh], device=rows.device)
            final = self.speculator.hold(sub, depth, num_tokens[idx])
            self._set_final(sub, [rows_host[b] for b in fresh], final)
            for b in fresh:
                behind.setdefault(rows_host[b], n_host[b])
                held[rows_host[b]] = depths[b]
        self._write(rows, rows_host, depths, n_host, accepted, hidden, n)
        get = self.final_host.get
        return [get(row, NONE) for row in rows_host[:B]]

    def _set_final(self, rows: torch.Tensor, rows_host: list[int], final: torch.Tensor) -> None:
        """The lagging slots rows [R] (host copies rows_host) keep Drafts.num_final `final` [R]
        while they lag (one device -> host copy when a slot starts to lag or changes depth)."""
        self.final[rows] = final
        self.final_host.update(zip(rows_host, final.tolist()))

    def _write(self, rows, rows_host, depths, n_host, accepted, hidden, n) -> None:
        """ring[slot, j % window] = h_j for the window's kept positions j = n .. n + accepted of
        the rows of depth > 0 (the others write the pad row)."""
        B, T, W, pad = len(rows_host), hidden.shape[1], self.window, self.cache.pad_row
        dev = rows.device
        if T == 1:          # the step of plain decoding's shape: one host-built index, one copy
            flat = [(row if d else pad) * W + j % W for row, d, j in zip(rows_host, depths, n_host)]
            self._flat.index_copy_(0, torch.tensor(flat, device=dev), hidden[:B, 0])
            return
        t = torch.arange(T, device=dev)
        depth = torch.tensor(depths, device=dev)
        n = torch.tensor(n_host, device=dev) if n is None else n[:B]
        keep = (t[None] <= accepted[:, None]) & (depth[:, None] > 0)
        put_rows(self.ring, torch.where(keep, rows[:B, None], pad), (n[:, None] + t) % W, hidden[:B])

    def prefill(self, batch: DraftBatch, rows_host: list[int], depths: list[int], starts: list[int],
                lengths: list[int], defer: bool) -> torch.Tensor | None:
        """The draft modules' part of prefill chunks (batch: their DraftBatch; rows_host, depths,
        starts, lengths: its rows' slots, depths, chunk starts and token counts). defer (the step
        drafts nothing) and every row's lag after its chunk fits the ring: no module runs, the
        chunks' target hidden states go to the ring, the rows of depth > 0 are behind from their
        first deferred position, -> Drafts.num_final [B] (their modules' progress). Else the rows
        behind catch up over [behind, start) and None: the caller runs the round over the chunks."""
        W = self.window
        lag = [s + n - self.behind.get(row, s) for row, s, n in zip(rows_host, starts, lengths)]
        if not defer or any(d and x > W for d, x in zip(depths, lag)):
            self.catch_up(batch.rows, rows_host, depths, starts, self.lagging(rows_host))
            return None
        rows, dev, pad = batch.rows, batch.rows.device, self.cache.pad_row
        t = torch.arange(max(lengths), device=dev)
        keep = (t[None] < torch.tensor(lengths, device=dev)[:, None]) & (batch.depth[:, None] > 0)
        put_rows(self.ring, torch.where(keep, rows[:, None], pad), (batch.target_start[:, None] + t) % W,
                 batch.target_hidden[:, : len(t)])
        deep = [b for b, d in enumerate(depths) if d]
        if deep:
            idx = torch.tensor(deep, device=dev)
            self._set_final(rows[idx], [rows_host[b] for b in deep],
                            self.speculator.hold(rows[idx], batch.depth[idx], batch.num_tokens[idx]))
            for b in deep:
                self.behind.setdefault(rows_host[b], starts[b])
                self.depth[rows_host[b]] = depths[b]
        return self.final[rows]

    def catch_up(self, rows: torch.Tensor, rows_host: list[int], depths: list[int], n_host: list[int],
                 which: list[int]) -> None:
        """One round without drafts for the requests `which` (indices into rows [B]) that are
        behind: every module of their depth over the positions whose inputs were known before
        the step (module 1 over [behind, n), module k up to n + 1 - k), the target hidden states
        read from the ring. Afterwards they are no longer behind."""
        which = [b for b in which if rows_host[b] in self.behind and depths[b] > 0]
        if not which:
            return
        dev, t0, before = rows.device, self.now(), self.num_module_tokens
        for b in which:
            self.depth.pop(rows_host[b], None)
            self.final_host.pop(rows_host[b], None)
        start = [self.behind.pop(rows_host[b]) for b in which]
        self.final[rows[torch.tensor(which, device=dev)]] = NONE
        n = [n_host[b] for b in which]
        lengths = [e - s for s, e in zip(start, n)]
        if max(lengths) > 0:
            self._round(rows, which, start, n, lengths, depths)
        self.spent = (self.spent[0] + self.now() - t0, self.spent[1] + self.num_module_tokens - before)

    def _round(self, rows, which, start, n, lengths, depths) -> None:
        dev = rows.device
        sub = rows[torch.tensor(which, device=dev)]
        starts = torch.tensor(start, device=dev)
        t = torch.arange(max(lengths), device=dev)
        hidden = self.ring[sub[:, None], (starts[:, None] + t) % self.window]        # [Bc, Tc, H]
        ends = torch.tensor(n, device=dev)
        depth = torch.tensor([depths[b] for b in which], device=dev)
        batch = DraftBatch(sub, ends + 1, ends, torch.zeros_like(sub, dtype=torch.bool), depth, starts,
                           hidden, 0, max(depths[b] for b in which), drafts=torch.zeros_like(sub))
        self.speculator.propose(self.cache, batch)
        self.num_module_tokens += sum(length * depths[b] for length, b in zip(lengths, which))
