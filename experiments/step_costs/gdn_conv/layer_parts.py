"""Where a Gated DeltaNet layer's time goes inside the demo target's forward at batch B: an
instrumented copy of GatedDeltaNet.forward (the same ops as mtpx/models/deltanet.py, wall-clock
timers around each part, summed over the 24 layers) over T tokens per request (T = 1: plain
decoding's step, its state stored; T > 1: a verification window, kept for the commit), the Ts
alternated, medians of 10 forwards, ms. "total" is the whole target forward. On a tree before
causal_conv existed it times the unfolded sum those trees ran.

    OMP_NUM_THREADS=2 python experiments/step_costs/gdn_conv/layer_parts.py B T1,T2,...
"""
import collections
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mtpx import LLM  # noqa: E402
from mtpx.engine.compiled import verify_forward  # noqa: E402
from mtpx.models import deltanet  # noqa: E402
from mtpx.models.gated_delta_rule import window_gated_delta_rule  # noqa: E402

torch.set_num_threads(2)
B = int(sys.argv[1])
Ts = [int(x) for x in sys.argv[2].split(",")]
parts = collections.defaultdict(float)


class timed:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        parts[self.name] += time.perf_counter() - self.t0


def forward(self, x, state=None, meta=None):
    """GatedDeltaNet.forward with a decode or window meta, timed by part."""
    B, T, _ = x.shape
    with timed("projections"):
        q, k, v, z, b, a = self._split(x)
    with timed("conv"):
        mixed = torch.cat([q, k, v], dim=-1).transpose(1, 2)
        prev = state.conv[meta.rows].to(mixed.dtype)
        ext = torch.cat([prev, mixed], dim=-1)
        conv = F.silu(causal_conv(ext, self.conv1d.weight)).transpose(1, 2)
        q, k, v = conv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
    with timed("heads and gates"):
        q, k = (t.unflatten(-1, (self.nk, 1, self.dk)).expand(-1, -1, -1, self.nv // self.nk, -1)
                .flatten(2, 3) for t in (q, k))
        v = v.unflatten(-1, (self.nv, self.dv))
        beta = torch.sigmoid(b) * meta.valid[..., None]
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias) * meta.valid[..., None]
    if meta.keep_states:
        with timed("window form"):
            o, window = window_gated_delta_rule(q, k, v, g, beta, state.ssm[meta.rows])
        with timed("keep window"):
            state.keep_window(meta.rows, window, ext)
    else:
        with timed("recurrent step and store"):
            o, final = self._prefill(q, k, v, g, beta, ext, state, meta)
            state.ssm.index_copy_(0, meta.rows, final.to(state.ssm.dtype))
            idx = meta.lengths[:, None, None] + torch.arange(self.kernel - 1, device=x.device)
            state.conv.index_copy_(0, meta.rows,
                                   ext.gather(2, idx.expand(B, self.conv_dim, -1)).to(state.conv.dtype))
    with timed("norm and out_proj"):
        return self.out_proj(self.norm(o, z).reshape(B, T, self.value_dim))


def unfolded(ext, weight):
    """The conv before mtpx.models.deltanet.causal_conv existed (this script on an older tree)."""
    return (ext.unfold(-1, weight.shape[-1], 1) * weight[:, 0, None, :]).sum(-1)


causal_conv = getattr(deltanet, "causal_conv", unfolded)
deltanet.GatedDeltaNet.forward = forward
llm = LLM(model=str(ROOT / "checkpoints" / "demo"), spec="mtp8", num_speculative_tokens=8,
          max_num_seqs=B, max_model_len=1024)
cache, model = llm.engine.runner.cache, llm.model
n = 192
metas = {T: cache.static_meta(torch.full((B,), n), torch.full((B,), T), torch.arange(B), T,
                              -(-(n + 30) // cache.block_size), keep_states=T > 1) for T in Ts}
res = {T: collections.defaultdict(list) for T in Ts}
with torch.inference_mode():
    for i in range(11):                                       # the first round untimed
        for T in Ts:
            parts.clear()
            t0 = time.perf_counter()
            verify_forward(model, cache, metas[T])
            total = time.perf_counter() - t0
            cache.clear_pending()
            if i:
                res[T]["total"].append(total)
                for name, s in parts.items():
                    res[T][name].append(s)
for T in Ts:
    print(f"batch {B}, T {T}: " + ", ".join(f"{name} {1e3 * statistics.median(v):.2f}"
                                            for name, v in res[T].items()))
