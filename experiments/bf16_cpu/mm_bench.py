"""fp32 vs bf16 matrix products of training shapes on this CPU (experiments/bf16_cpu/README.md).

    python experiments/bf16_cpu/mm_bench.py
"""
import time

import torch

torch.set_num_threads(2)


def ms(x: torch.Tensor, y: torch.Tensor, n: int = 10) -> float:
    """Mean ms of x @ y over n products after one untimed one."""
    x @ y
    t0 = time.perf_counter()
    for _ in range(n):
        x @ y
    return (time.perf_counter() - t0) / n * 1e3


for dt in (torch.float32, torch.bfloat16):
    a, w, g = (torch.randn(4096, 128, dtype=dt), torch.randn(384, 128, dtype=dt),
               torch.randn(4096, 384, dtype=dt))
    head, gl = torch.randn(2048, 128, dtype=dt), torch.randn(4096, 2048, dtype=dt)
    rows = {"fwd a@w.T": (a, w.t()), "dgrad g@w": (g, w), "wgrad g.T@a": (g.t(), a),
            "lm_head": (a, head.t()), "lm wgrad": (gl.t(), a), "lm dgrad": (gl, head)}
    print(dt, "  ".join(f"{name} {ms(x, y):.2f}" for name, (x, y) in rows.items()))
print(torch.__config__.show().split("CPU capability usage:")[1].split("\n")[0].strip())
