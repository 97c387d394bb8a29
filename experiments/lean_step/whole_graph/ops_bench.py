"""The Gated DeltaNet decode kernel over 24 layers' states at batch 64 (the demo's shapes), called
directly (eager), through mtpx's operators (torch.library.Library define / impl:
mtpx/kernels/torch_ops.py) and through the same operators defined with torch.library.custom_op
(how mtpx defined them before): microseconds a layer, three rounds, 1 thread.

    OMP_NUM_THREADS=1 python experiments/lean_step/whole_graph/ops_bench.py
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402

from mtpx.models import gdn_kernel as g  # noqa: E402

torch.set_num_threads(1)
assert g.available(), "the CPU kernels are not built"
B, R, nk, nv, dk, dv, K, L = 64, 65, 2, 4, 32, 32, 4, 24
conv_dim = 2 * nk * dk + nv * dv
conv, ssm = torch.randn(L, R, conv_dim, K - 1), torch.randn(L, R, nv, dk, dv) * 0.01
x, gates = torch.randn(B, 2 * nk * dk + 2 * nv * dv), torch.randn(B, 2 * nv)
w, rows, valid = torch.randn(conv_dim, K), torch.arange(B), torch.ones(B, dtype=torch.bool)
A, dt, nw = torch.randn(nv), torch.randn(nv), torch.ones(dv)


@torch.library.custom_op("bench::gdn_decode_", mutates_args=("conv", "ssm"))
def custom_in_place(x: torch.Tensor, gates: torch.Tensor, weight: torch.Tensor, conv: torch.Tensor,
                    ssm: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, A_log: torch.Tensor,
                    dt_bias: torch.Tensor, norm_weight: torch.Tensor, eps: float, nk: int,
                    nv: int) -> torch.Tensor:
    return g._gdn_decode(x, gates, weight, conv, ssm, rows, valid, A_log, dt_bias, norm_weight, eps, nk, nv,
                         in_place=True)[0]


@torch.library.custom_op("bench::gdn_decode", mutates_args=())
def custom_functional(x: torch.Tensor, gates: torch.Tensor, weight: torch.Tensor, conv: torch.Tensor,
                      ssm: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, A_log: torch.Tensor,
                      dt_bias: torch.Tensor, norm_weight: torch.Tensor, eps: float, nk: int,
                      nv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return g._gdn_decode(x, gates, weight, conv, ssm, rows, valid, A_log, dt_bias, norm_weight, eps, nk, nv,
                         in_place=False)


def layers(fn, **kw):
    def run():
        for i in range(L):
            fn(x, gates, w, conv[i], ssm[i], rows, valid, A, dt, nw, 1e-6, nk, nv, **kw)
    return run


contenders = {"direct (eager)": layers(g._gdn_decode, in_place=True),
              "mtpx::gdn_decode_ (Library, in place)": layers(torch.ops.mtpx.gdn_decode_),
              "custom_op, in place": layers(torch.ops.bench.gdn_decode_),
              "mtpx::gdn_decode (Library, functional)": layers(torch.ops.mtpx.gdn_decode),
              "custom_op, functional": layers(torch.ops.bench.gdn_decode)}
print(f"# torch {torch.__version__}, 1 thread, batch {B}, {L} layers; us a layer")
with torch.inference_mode():
    for rnd in range(3):
        for name, run in contenders.items():
            for _ in range(5):
                run()
            t = time.perf_counter()
            for _ in range(30):
                run()
            print(f"round {rnd}: {name}: {(time.perf_counter() - t) / 30 / L * 1e6:.1f}")
