"""Per-forward metadata shared by every layer: where each token sits and which cache row it uses."""
from dataclasses import dataclass

import torch


@dataclass
class ForwardMeta:
    """Metadata of one batched forward over a right-padded [B, T] token grid.

    positions: [B, T] int64, absolute position of each token (padding entries hold 0).
    valid: [B, T] bool, True for real tokens; padding tokens write no cache and change no state.
    rows: [B] int64, the cache row (batch slot) of each request.
    kv_len: keys to read from the attention cache = max position in the batch + 1.
    keep_states: Gated DeltaNet keeps the recurrent and conv state after every token (verification
        windows), so that a rejection selects a state instead of re-running the model.
    """

    positions: torch.Tensor
    valid: torch.Tensor
    rows: torch.Tensor
    kv_len: int
    keep_states: bool = False

    @staticmethod
    def build(starts: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor,
              keep_states: bool = False) -> "ForwardMeta":
        """Request b covers positions starts[b] .. starts[b] + lengths[b] - 1 (all [B] int64)."""
        T = int(lengths.max())
        t = torch.arange(T, device=starts.device)
        valid = t[None, :] < lengths[:, None]
        positions = torch.where(valid, starts[:, None] + t[None, :], 0)
        return ForwardMeta(positions, valid, rows, int((starts + lengths).max()), keep_states)

    def select(self, idx: torch.Tensor) -> "ForwardMeta":
        """The metadata of a subset of the requests (idx: [B'] int64 batch indices)."""
        return ForwardMeta(self.positions[idx], self.valid[idx], self.rows[idx], self.kv_len,
                           self.keep_states)

    @property
    def lengths(self) -> torch.Tensor:
        return self.valid.sum(1)
