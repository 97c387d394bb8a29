"""Dim-0 gathers of contiguous slices as mtpx's decode step makes them at batch 64, by advanced
indexing (`t[idx]`, ATen's index kernel) and by `index_select`, µs (median of 50 calls; the
inputs are small enough to stay in cache): the keys of 896 paged blocks [16, 2, 32]; one Gated
DeltaNet layer's states [4, 32, 32] and conv windows [256, 3] of 64 rows; the same states from a
view into the stacked layers; `index_select` into a preallocated output; a plain copy of the
states for reference.

    OMP_NUM_THREADS=2 python experiments/step_costs/batch64_window/gather_forms.py
"""

import torch

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))  # the shared timer
from timing import bench as timed  # noqa: E402  (tools/timing.py)


def bench(f):
    return timed(f, n=50, warmup=5)

torch.set_num_threads(2)



kc = torch.randn(1200, 16, 2, 32)
ids = torch.randint(0, 1200, (64, 14))
ssm, conv = torch.randn(65, 4, 32, 32), torch.randn(65, 256, 3)
stacked = torch.randn(24, 65, 4, 32, 32)
rows = torch.randperm(64)
out = torch.empty(64, 4, 32, 32)
print("keys of 896 blocks: index", bench(lambda: kc[ids]), "index_select",
      bench(lambda: kc.index_select(0, ids.flatten())))
print("states of 64 rows: index", bench(lambda: ssm[rows]), "index_select",
      bench(lambda: ssm.index_select(0, rows)),
      "index_select out=", bench(lambda: torch.index_select(ssm, 0, rows, out=out)), "copy of all",
      bench(lambda: ssm.clone()))
print("states from the stacked layers' view: index", bench(lambda: stacked[3][rows]),
      "index_select", bench(lambda: stacked[3].index_select(0, rows)))
print("conv windows of 64 rows: index", bench(lambda: conv[rows]), "index_select",
      bench(lambda: conv.index_select(0, rows)))
