"""Incremental forwards with caches equal the from-scratch forward (prefill, decode, verification
windows with state selection) on a ragged batch in float64."""
import torch

from mtpx.cache.model_cache import ModelCache
from tests.helpers import peaked_model, tiny_config


def test_incremental_equals_full_forward():
    m = peaked_model(tiny_config())
    torch.manual_seed(1)
    x = torch.randint(0, 64, (3, 40))
    ref = m.model(x)                                                    # [3, 40, hidden]
    cache = ModelCache(m, rows=5, max_len=64, num_draft_modules=0, block_size=8).static_block_tables()
    rows = torch.tensor([4, 0, 2])
    lens = torch.tensor([20, 25, 1])
    meta = cache.meta(torch.zeros(3, dtype=torch.long), lens, rows)
    h = m.model(torch.where(meta.valid, x[:, :25], 0), meta, cache.target)
    for b in range(3):
        torch.testing.assert_close(h[b, : lens[b]], ref[b, : lens[b]], atol=1e-12, rtol=0)
    for _ in range(3):  # one-token decode steps
        meta = cache.meta(lens, torch.ones(3, dtype=torch.long), rows)
        h = m.model(x[torch.arange(3), lens][:, None], meta, cache.target)
        torch.testing.assert_close(h[:, 0], ref[torch.arange(3), lens], atol=1e-12, rtol=0)
        lens = lens + 1
    # verification windows of different lengths, then keep the state after token `keep[b]`
    win = torch.tensor([4, 3, 5])
    meta = cache.meta(lens, win, rows, keep_states=True)
    ids = torch.stack([x[b, lens[b]: lens[b] + 5] for b in range(3)])
    h = m.model(torch.where(meta.valid, ids, 0), meta, cache.target)
    for b in range(3):
        torch.testing.assert_close(h[b, : win[b]], ref[b, lens[b]: lens[b] + win[b]], atol=1e-12, rtol=0)
    keep = torch.tensor([0, 2, 3])
    cache.commit_recurrent(keep)
    lens = lens + keep + 1
    meta = cache.meta(lens, torch.full((3,), 2), rows)
    ids = torch.stack([x[b, lens[b]: lens[b] + 2] for b in range(3)])
    h = m.model(ids, meta, cache.target)
    for b in range(3):
        torch.testing.assert_close(h[b], ref[b, lens[b]: lens[b] + 2], atol=1e-12, rtol=0)
