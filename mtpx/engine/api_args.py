"""Checks of the Python API's arguments (`LLM(...)`, `LLM.generate`) that torch would otherwise
answer with its own error (an AssertionError, a RuntimeError) or not at all: each raises one
ValueError naming the argument and the fix."""
from __future__ import annotations

import numbers

import torch

from mtpx.core.sampling_params import SamplingParams


def check_device(device) -> None:
    """Raises ValueError when torch cannot place the model on `device` (a str such as "cpu",
    "cuda", "cuda:1"): an unknown name, a type mtpx does not run on, CUDA on a build or machine
    without it, a GPU index past the visible ones."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a device torch knows: use 'cpu' or 'cuda'") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: mtpx runs on 'cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ValueError(f"device={device!r}: {why} (torch {torch.__version__}): use device='cpu', or run "
                         "on a GPU machine with a CUDA build of torch")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: {torch.cuda.device_count()} CUDA GPU(s) visible: "
                         "use an index below that")


def check_threads(threads) -> None:
    """threads: None (torch's default), a callable, or an integer >= 1 (torch threads). Raises
    ValueError otherwise (torch ignores 0 and raises its own error for a negative count)."""
    if threads is None or callable(threads):
        return
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise ValueError(f"threads={threads!r}: must be an integer >= 1 (torch threads), or None for "
                         "torch's default")


def sampling_params_list(sampling_params, num_prompts: int) -> list[SamplingParams]:
    """generate's sampling_params as one SamplingParams per prompt: None (the defaults), one
    SamplingParams for all, or a list/tuple of them (vLLM's types). A dict is refused as vLLM's
    type hints do, with the fix (SamplingParams(**d)). Raises ValueError."""
    if sampling_params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_prompts
    if isinstance(sampling_params, dict):
        raise ValueError(f"sampling_params={sampling_params!r} is a dict: pass "
                         "SamplingParams(**sampling_params) (from mtpx import SamplingParams)")
    if not isinstance(sampling_params, (list, tuple)) or not all(
            isinstance(p, SamplingParams) for p in sampling_params):
        raise ValueError(f"sampling_params of type {type(sampling_params).__name__}: pass a SamplingParams "
                         "or a list of them (one per prompt)")
    if len(sampling_params) != num_prompts:
        raise ValueError(f"{num_prompts} prompts but {len(sampling_params)} SamplingParams")
    return list(sampling_params)


def structured_outputs_config(config) -> dict:
    """vLLM's `LLM(structured_outputs_config={...})` as engine keys: {"disable_any_whitespace": b}
    -> {"structured_outputs_disable_any_whitespace": b}; None -> {}. Raises ValueError naming the
    key for anything else (mtpx has one grammar backend, xgrammar)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError("structured_outputs_config: must be a dict such as {'disable_any_whitespace': True}")
    unknown = sorted(set(config) - {"disable_any_whitespace", "backend"})
    if unknown or config.get("backend", "auto") not in ("auto", "xgrammar"):
        raise ValueError(f"structured_outputs_config: {', '.join(unknown) or 'backend'} not supported "
                         "(mtpx takes disable_any_whitespace, and backend 'auto' or 'xgrammar')")
    if not isinstance(config.get("disable_any_whitespace", False), bool):
        raise ValueError("structured_outputs_config.disable_any_whitespace: must be true or false")
    return {"structured_outputs_disable_any_whitespace": config.get("disable_any_whitespace", False)}
