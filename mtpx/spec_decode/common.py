"""What both MTP speculators share: the window of recent module outputs, the gathering of a module's
hidden-state input, and one batched module forward."""
from __future__ import annotations

import torch

from mtpx.cache.model_cache import ModelCache, put_rows
from mtpx.attention.meta import ForwardMeta
from mtpx.models.model import MTPForCausalLM


class HiddenWindow:
    """The outputs a^k of draft modules 1..levels at the last `window` positions of each batch
    slot (a ring: position p at index p % window). buf[k-1]: [rows, window, hidden].

    A module only ever reads an output of an earlier round at a position within the last
    num_speculative_tokens positions (the re-prefill start, multi_module.py), so the window keeps
    memory per request constant instead of growing with the sequence.
    """

    def __init__(self, levels: int, rows: int, window: int, hidden: int, dtype, device):
        """rows: batch slots including ModelCache's pad row, which must be the last (rows - 1)."""
        self.window = window
        self.pad_row = rows - 1
        self.buf = [torch.zeros(rows, window, hidden, dtype=dtype, device=device)
                    for _ in range(levels)]

    def read(self, level: int, meta: ForwardMeta) -> torch.Tensor:
        """-> [B, T, hidden], module `level`'s outputs at meta's rows and positions."""
        return self.buf[level - 1][meta.rows[:, None], meta.positions % self.window]

    def write(self, level: int, meta: ForwardMeta, values: torch.Tensor) -> None:
        """values [B, T, hidden] at meta's positions; only each row's last `window` are kept (the
        others, and padding, are written to the pad row: no shape depends on a value)."""
        # positions[:, :1], not meta.ends' positions[:, 0]: Inductor lowers a select of a batched
        # column to a view that guards on B != 1 (a batch of one would compile the round again)
        ends = meta.positions[:, :1] + meta.lengths[:, None]
        keep = meta.valid & (meta.positions >= ends - self.window)
        rows = torch.where(keep, meta.rows[:, None], self.pad_row)
        put_rows(self.buf[level - 1], rows, meta.positions % self.window, values)


def gather_hidden(meta: ForwardMeta, prev: torch.Tensor, prev_start: torch.Tensor,
                  window: HiddenWindow | None = None, level: int = 0) -> torch.Tensor:
    """The hidden-state input a^{level}_j at meta's positions j: from `prev` ([B, T', hidden], this
    round's outputs at positions prev_start[b, 0] + t; prev_start [B, 1] int64) where
    j >= prev_start, else from `window` (earlier rounds). -> [B, T, hidden]."""
    idx = meta.positions - prev_start
    cur = prev.gather(1, idx.clamp(0, prev.shape[1] - 1)[..., None].expand(-1, -1, prev.shape[-1]))
    if window is None or level == 0:
        return cur
    return torch.where((idx >= 0)[..., None], cur, window.read(level, meta))


def run_module(model: MTPForCausalLM, cache: ModelCache, k: int, meta: ForwardMeta,
               hidden: torch.Tensor) -> torch.Tensor:
    """Draft module k (1-based) over meta's positions j: reads token x_{j+k} from the token buffer
    and hidden = a^{k-1}_j [B, T, hidden]; writes its KV into cache.draft[k-1] (the same paged
    slots as the target's KV at position j). Returns a^k [B, T, hidden]."""
    tokens = cache.tokens[meta.rows[:, None], meta.positions + k]         # [B, T]
    emb = model.model.embed_tokens(tokens)
    return model.mtp[k - 1](emb, hidden, meta.positions, cache.draft[k - 1], meta)


def module_meta(cache: ModelCache, starts: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor,
                num_columns: int | None, num_blocks: int | None) -> ForwardMeta:
    """A module forward's metadata: static (num_columns columns, num_blocks blocks) or dynamic."""
    if num_columns is None:
        return cache.meta(starts, lengths, rows)
    return cache.static_meta(starts, lengths, rows, num_columns, num_blocks)


def max_module_positions(num_window_tokens: int, num_drafts: int, num_prev_drafts: int,
                         num_draft_modules: int) -> int:
    """Most positions one module forward of a decode round covers (host-side, for the static
    plan's columns), for a request that verified a window of num_window_tokens, drafted
    num_prev_drafts the round before and drafts num_drafts now, running num_draft_modules
    modules (its depth's). A round runs the modules that draft and the one after them to the last
    known token (MultiModuleMTPSpeculator.plan), m = min(num_drafts + 1, num_draft_modules);
    module j of them re-prefills max(window, j) positions when it reached it last round too
    (j <= num_prev_drafts + 1), else it lags j - 1 positions behind and covers window - 1 + j;
    the others only catch up, over at most the window. One module (single-module MTP): the window."""
    m = min(num_drafts + 1, num_draft_modules)
    if m <= num_prev_drafts + 1:
        return max(num_window_tokens, m)
    return num_window_tokens - 1 + m


def last_valid(x: torch.Tensor, meta: ForwardMeta) -> torch.Tensor:
    """x: [B, T, ...] -> the entry at each request's last real token, [B, ...] (index 0 for a
    request with no token)."""
    return x[torch.arange(x.shape[0], device=x.device), (meta.lengths - 1).clamp(min=0)]
