"""The decode step behind one interface: `StepShapes` decides a step's shapes in one place, and a
DecodeStep (`EagerStep` here, `CompiledDecode` in compiled.py) runs its three parts the same way
eager or compiled:

    verify(meta)             -> (ids, hidden, logits) of the target over the verification windows
    commit(accepted, save)   -> the Gated DeltaNet states kept at the accepted tokens
    draft(batch)             -> Drafts: the speculator's round (Speculator.propose)

The model runner (mtpx/engine/model_runner.py) calls them and never asks which form it holds.

Shapes (`StepShapes.plan`): eager, the batch is not padded, a window has 1 + the most drafts a
request verifies, and keys are read from exactly the blocks the step touches. Static (compiled),
gpt-fast's recipe and vLLM's capture sizes: the batch is padded to a capture size (1, 2, 4, 8, then
multiples of 8), the window and the draft round are built for the depth bucket of the deepest
request (depth_bucket: 0, k // 2 or k unless engine.compile_depths says otherwise; fewer drafts are
padding; with engine.ragged_batch a window wider than one token runs packed, its token count a
dynamic size: ForwardMeta.pack_valid), a step that neither verifies nor proposes a draft has a
1-token window, the draft round's forwards have width + 1 columns (a 1-token window's round
too: one draft graph), and keys are read from a power-of-two number of blocks: a few graphs
serve every step. A round whose modules' catch-up needs more than width + 1 columns (a step
drafting two or more more than the one before) is two rounds of the same graph: first one without drafts
(StepShapes.catch_up, draft_rounds), after which width + 1 columns suffice.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from mtpx.attention.meta import ForwardMeta
from mtpx.spec_decode.common import max_module_positions
from mtpx.spec_decode.protocol import DraftBatch, Drafts


def verify_forward(model, cache, meta: ForwardMeta):
    """The target over static verification windows (ModelCache.static_meta with keep_states):
    -> (ids [Bp, T] int64, the windows' tokens (0 for padding), hidden [Bp, T, H], logits
    [Bp, T, V]); Gated DeltaNet keeps its per-token states for commit_recurrent. With
    meta.packed (eager: the ragged layout) the model and lm_head run on the real tokens alone and
    the results come back on the grid, zeros at padding."""
    ids = torch.where(meta.valid, cache.tokens[meta.rows[:, None], meta.positions], 0)
    h = model.model(ids, meta, cache.target)
    if meta.packed is not None:
        return ids, meta.unpack(h), meta.unpack(model.lm_head(h))
    return ids, h, model.lm_head(h)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, 16, 24, ... (vLLM's cudagraph_capture_sizes), up to and
    including max_num_seqs."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    sizes += list(range(8, max_num_seqs, 8))
    return sizes + [max_num_seqs]


def block_bucket(num_positions: int, block_size: int, max_blocks: int) -> int:
    """Blocks to read for positions 0 .. num_positions - 1: the next power of two >= 2 (so a
    block count seldom needs a new CUDA graph), at most max_blocks."""
    need = max(2, -(-num_positions // block_size))
    return min(max_blocks, 1 << (need - 1).bit_length())


def depth_buckets(k: int, depths=None) -> list[int]:
    """The depths a compiled step is built for (EngineConfig.compile_depths): 0, k and those of
    `depths` between; depths None: 0, k // 2 from k = 4 on, and k."""
    inner = ((k // 2,) if k >= 4 else ()) if depths is None else depths
    return sorted({0, k, *(d for d in inner if 0 < d < k)})


def depth_bucket(depth: int, k: int, depths=None) -> int:
    """The depth a compiled step's shapes are built for: the smallest of depth_buckets(k, depths)
    >= depth, at most k (a fixed k is its own bucket); 0 for 0."""
    if depth <= 0:
        return 0
    return min(d for d in depth_buckets(k, depths) if d >= min(depth, k))


@dataclass
class StepShapes:
    """The shapes of one decode step.

    batch: requests verified; padded_batch: rows of the step's tensors (padding rows after them);
    window: tokens per verification window (T); depth: draft modules the round runs (1..depth);
    num_drafts: the most drafts a request proposes (the round's); draft_columns: columns of the
    draft round's forwards; num_blocks: blocks of keys read; catch_up: (static) the modules'
    catch-up needs more than draft_columns, so a round without drafts runs first (draft_rounds).
    keep_states: the windows keep the per-token Gated DeltaNet states (window > 1; a 1-token
    window stores its state in the forward).
    """

    batch: int
    padded_batch: int
    window: int
    depth: int
    num_drafts: int
    draft_columns: int
    num_blocks: int
    catch_up: bool = False

    @property
    def keep_states(self) -> bool:
        return self.window > 1

    @staticmethod
    def plan(num_tokens: list[int], num_draft_tokens: list[int], depths: list[int],
             num_prev_drafts: list[int], num_new_drafts: list[int], *, k: int, num_draft_modules: int,
             block_size: int, max_blocks: int, padded_batch: int, static: bool,
             depth_buckets=None) -> "StepShapes":
        """Per request: num_tokens (known tokens), num_draft_tokens (drafts it verifies), depths
        (Request.draft_depth), num_prev_drafts (drafts it holds), num_new_drafts (drafts it
        proposes: ScheduledDecode.num_new_drafts); k: the speculator's num_speculative_tokens
        (0: plain decoding); padded_batch: the form's padded batch; static: compiled shapes
        (module doc); depth_buckets: EngineConfig.compile_depths (depth_bucket)."""
        depth = max(depths)
        num_drafts = max(num_new_drafts)
        window = 1 + max(num_draft_tokens)
        narrow = window == 1 and num_drafts == 0       # static: the only 1-token windows
        width = max(depth, window - 1)                 # drafts made before a depth fell may be more
        if static:
            width = depth = depth_bucket(width, k, depth_buckets)
        need = max(num_tokens) - 1 + 2 * width + 2     # drafts reach n + 2 width - 1
        num_blocks = (block_bucket(need, block_size, max_blocks) if static
                      else min(max_blocks, -(-need // block_size)))
        if static and not narrow:
            window = width + 1
        columns = 1
        if k:
            per_request = zip(num_draft_tokens, depths, num_prev_drafts, num_new_drafts)
            columns = max(max_module_positions(1 + nd, new, prev, min(d, num_draft_modules))
                          for nd, d, prev, new in per_request)
        catch_up = False
        if static and width:
            # every round in width + 1 columns (a 1-token window's too, its padding inert); a
            # module that lagged behind drafts that it now makes first catches up in a round
            # without drafts, which covers at most the window (multi_module.py)
            catch_up, columns = columns > width + 1, width + 1
        return StepShapes(len(num_tokens), padded_batch, window, depth, num_drafts, columns, num_blocks,
                          catch_up)


def draft_rounds(propose, batch: DraftBatch) -> Drafts:
    """propose(batch) (Speculator.propose's contract), preceded when batch.catch_up by a round
    without drafts (num_drafts 0, argmax; its drafts are dropped, and overwritten where read): it
    brings every module to the positions its final inputs allow, after which module m of the
    drafting round covers at most m positions (StepShapes.catch_up)."""
    if batch.catch_up:
        batch = dataclasses.replace(batch, catch_up=False)
        no_drafts = None if batch.drafts is None else torch.zeros_like(batch.drafts)
        propose(dataclasses.replace(batch, num_drafts=0, drafts=no_drafts, sampler=None))
    return propose(batch)


class DecodeStep(Protocol):
    """The decode step's interface (module doc); `static` selects StepShapes' compiled shapes."""

    static: bool

    def padded_batch(self, batch: int) -> int:
        """Rows the step's tensors have for `batch` requests."""

    def packed_tokens(self, num_tokens: int, grid_tokens: int) -> int:
        """Tokens a ragged verification forward of num_tokens real tokens on a grid of
        grid_tokens runs on (ForwardMeta.pack_valid's num_tokens)."""

    def verify(self, meta: ForwardMeta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """verify_forward's contract."""

    def commit(self, index: torch.Tensor, save: tuple | None = None) -> None:
        """ModelCache.commit_recurrent's contract."""

    def draft(self, batch: DraftBatch) -> Drafts:
        """Speculator.propose's contract."""


class EagerStep:
    """The decode step run eager (DecodeStep): exact shapes, no padding."""

    static = False

    def __init__(self, model, cache, speculator=None):
        self.model, self.cache, self.speculator = model, cache, speculator

    def padded_batch(self, batch: int) -> int:
        return batch

    def packed_tokens(self, num_tokens: int, grid_tokens: int) -> int:
        return num_tokens

    def verify(self, meta: ForwardMeta):
        return verify_forward(self.model, self.cache, meta)

    def commit(self, index: torch.Tensor, save: tuple | None = None) -> None:
        self.cache.commit_recurrent(index, save)

    def draft(self, batch: DraftBatch) -> Drafts:
        return draft_rounds(lambda b: self.speculator.propose(self.cache, b), batch)
