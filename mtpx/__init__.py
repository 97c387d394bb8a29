"""mtpx: multi-token-prediction speculative decoding in plain PyTorch.

The public names load on first use (PEP 562, as vLLM's `vllm/__init__.py`): importing a submodule
such as mtpx.core.request does not pull in the model code, torch or the metrics' rich/omegaconf.
"""
from __future__ import annotations

import importlib
import typing

MODULE_ATTRS = {
    "LLM": "mtpx.engine.llm",
    "SamplingParams": "mtpx.core.sampling_params",
    "StructuredOutputsParams": "mtpx.core.structured_outputs",
    "RequestOutput": "mtpx.outputs",
    "CompletionOutput": "mtpx.outputs",
    "RequestMetrics": "mtpx.outputs",
}

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput",
           "RequestMetrics"]

if typing.TYPE_CHECKING:
    from mtpx.core.sampling_params import SamplingParams
    from mtpx.core.structured_outputs import StructuredOutputsParams
    from mtpx.engine.llm import LLM
    from mtpx.outputs import CompletionOutput, RequestMetrics, RequestOutput


def __getattr__(name: str):
    if name in MODULE_ATTRS:
        return getattr(importlib.import_module(MODULE_ATTRS[name]), name)
    raise AttributeError(f"module 'mtpx' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
