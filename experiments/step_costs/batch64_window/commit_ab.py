"""The eager Gated DeltaNet commit (RecurrentStateGroup.commit) with its gathers as index_select
and the conv windows gathered per slice of layers, against the form of commit 21ccc93 (advanced
indexing, the conv windows of all layers in one temporary), alternated call by call after a
fresh verification forward of the demo's target at batch B over T = k + 1 tokens (k = 1, 4, 8),
20 pairs each, random accepted positions; prints the median ms of each, the median of the
paired ratios (min-max) and the largest difference of the committed states between the last old
and new calls, beside that between the last two old calls (the same code on the same inputs:
the verification forward's float rounding can differ from call to call).

    OMP_NUM_THREADS=2 python experiments/step_costs/batch64_window/commit_ab.py 1,16,64
"""
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mtpx import LLM  # noqa: E402
from mtpx.cache.state import RecurrentStateGroup, WindowStates  # noqa: E402
from mtpx.engine.compiled import verify_forward  # noqa: E402

torch.set_num_threads(2)
new_commit = RecurrentStateGroup.commit


def old_commit(self, index):
    """RecurrentStateGroup.commit at 21ccc93 (eager path)."""
    rows = self.pending_rows
    if rows is None:
        return
    B, T = rows.shape[0], self.pending_len
    L, _, C, K1 = self.conv.shape
    at = index.view(1, B, 1, 1) + 1 + torch.arange(K1, device=index.device)
    conv = self.window_ext[:, rows].gather(-1, at.expand(L, B, C, K1))
    self.conv.index_copy_(1, rows, conv)
    step = max(1, self.slice_bytes // (B * self.ssm[0, 0].numel() * self.ssm.element_size()))
    for lo in range(0, L, step):
        part = WindowStates(*(w[lo: lo + step, rows, :, :T] for w in
                              (self.window_k, self.window_v_new, self.window_G)))
        state = self.ssm[lo: lo + step, rows]
        part.advance_(state, index)
        self.ssm[lo: lo + step].index_copy_(1, rows, state)


for B in (int(x) for x in sys.argv[1].split(",")):
    llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=8,
              max_num_seqs=B, max_model_len=1024)
    cache, model = llm.engine.runner.cache, llm.model
    n = 192
    for k in (1, 4, 8):
        T = k + 1
        meta = cache.static_meta(torch.full((B,), n), torch.full((B,), T), torch.arange(B), T,
                                 -(-(n + 30) // cache.block_size), keep_states=True)
        index = torch.randint(0, T, (B,), generator=torch.Generator().manual_seed(k))
        times = {"old": [], "new": []}
        outs = {}
        with torch.inference_mode():
            snapshot = [(g.ssm.clone(), g.conv.clone()) for g in cache.recurrent_groups]
            for i in range(21):                          # the first pair untimed
                for name in (("old", "new") if i % 2 else ("new", "old")):
                    for g, (s0, c0) in zip(cache.recurrent_groups, snapshot):
                        g.ssm.copy_(s0)
                        g.conv.copy_(c0)
                    verify_forward(model, cache, meta)
                    RecurrentStateGroup.commit = old_commit if name == "old" else new_commit
                    t0 = time.perf_counter()
                    cache.commit_recurrent(index)
                    dt = time.perf_counter() - t0
                    RecurrentStateGroup.commit = new_commit
                    if i:
                        times[name].append(1e3 * dt)
                    if name == "old" and "old" in outs:
                        outs["old before"] = outs["old"]
                    outs[name] = [t.clone() for g in cache.recurrent_groups for t in (g.ssm, g.conv)]
        diff = max((a - b).abs().max().item() for a, b in zip(outs["old"], outs["new"]))
        same = max((a - b).abs().max().item() for a, b in zip(outs["old"], outs["old before"]))
        r = [b / a for a, b in zip(times["old"], times["new"])]
        print(f"batch {B}, T {T}: old {statistics.median(times['old']):.2f} ms, new "
              f"{statistics.median(times['new']):.2f} ms, new / old {statistics.median(r):.2f} "
              f"({min(r):.2f}-{max(r):.2f}); largest state difference {diff:.1e} (old / old {same:.1e})",
              flush=True)
