"""nn.Linear whose eager CPU inference over a few rows runs mtpx's C kernel.

With few rows (a decode step at low concurrency, a short verification window, a draft module's
step) a linear layer's time is reading its weight from memory, which the BLAS behind F.linear
does at a fraction of the core's bandwidth; mtpx/kernels/linear.c reads it at the core's pace
(cpu_ops.linear). `Linear` is nn.Linear with the same parameters, state-dict names and hooks, and
calls the kernel where cpu_ops.linear_runs says so (torch.inference_mode, float32 CPU, at most
cpu_ops.LINEAR_MAX_ROWS rows); a compiled graph without gradients calls the operator mtpx::linear
(cpu_ops.linear_op_runs), which makes the same choice when it runs, so one graph serves every
batch size and computes eager's values. F.linear runs everywhere else (training,
CUDA, other dtypes, long prefills) and is the reference: `cpu_ops.use_kernel = False` forces it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from mtpx.models import cpu_ops


class Linear(nn.Linear):
    """nn.Linear (module doc). x: [..., in_features] -> [..., out_features]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight                  # once: a module's parameter lookup costs about 0.6 us
        if torch.compiler.is_compiling():
            if cpu_ops.linear_op_runs(x, weight):
                return torch.ops.mtpx.linear(x, weight, self.bias)
        elif cpu_ops.linear_runs(x, weight):
            return cpu_ops.linear(x, weight, self.bias)
        return F.linear(x, weight, self.bias)
