"""A decode step alone, without prefill (automatic k's calibration, mtpx/auto_k/calibration.py):
ModelRunner.decode's body."""
from __future__ import annotations

import time

import torch


def decode_alone(runner, decodes) -> tuple[float, float]:
    """Run the decode step of `decodes` (ScheduledDecode list) alone (`runner._decode`, the code
    path of every real step) and return (its seconds, its draft round's seconds), the device
    synchronized around it. A request without a batch slot gets one with its known tokens
    written, and positions [0, num_tokens - 1) are taken as computed without running the model
    (their KV and states are whatever the cache holds: a step's cost does not depend on them);
    every call re-runs the same positions (the speculator's rows are reset first). `release`
    frees the slots."""
    cache, dev = runner.cache, runner.device
    for d in decodes:
        r = d.request
        if r.index not in runner.rows:
            row = runner.rows[r.index] = cache.allocate_row()
            cache.write_tokens(torch.tensor([row], device=dev), torch.arange(r.num_tokens, device=dev)[None],
                               torch.tensor(r.all_token_ids, device=dev)[None])
        cache.set_block_table(runner.rows[r.index], d.block_table)
    if runner.speculator is not None:
        rows = torch.tensor([runner.rows[d.request.index] for d in decodes], device=dev)
        starts = torch.tensor([d.request.num_tokens - 1 for d in decodes], device=dev)
        runner.speculator.reset_rows(rows, starts)
        for d in decodes:
            runner.lazy.reset(runner.rows[d.request.index])
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    draft_s = runner._decode(decodes, {})[1]
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - t0, draft_s
