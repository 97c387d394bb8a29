"""mtpx: multi-token-prediction speculative decoding in plain PyTorch."""
from mtpx.engine.llm import LLM
from mtpx.engine.sampling_params import SamplingParams
from mtpx.metrics.stats import CompletionOutput, RequestMetrics, RequestOutput

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"]
