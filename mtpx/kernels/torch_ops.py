"""mtpx's C kernels as torch operators in the `mtpx` namespace, which compiled graphs call (eager
code calls the kernels directly).

Defined with torch.library.Library's define / impl and register_fake, not
torch.library.custom_op, whose Python wrapper costs several times a kernel call here
(docs/compiled_step.md, "Operators"). Nothing here has a gradient: the ops serve inference (no
autograd kernel is registered).
"""
from __future__ import annotations

import torch

__all__ = ["define"]

_lib = torch.library.Library("mtpx", "DEF")


def define(schema: str, impl, fake, any_device: bool = False) -> None:
    """Define mtpx::<schema> (torch's schema language: `Tensor(a!)` marks an input the op writes)
    with `impl` for CPU tensors (any_device: for every device, an impl made of torch ops) and
    `fake` for tracing (output shapes only)."""
    name = schema.split("(", 1)[0]
    _lib.define(schema)
    _lib.impl(name, impl, "CompositeExplicitAutograd" if any_device else "CPU")
    torch.library.register_fake(f"mtpx::{name}", fake, lib=_lib)
