from mtpx.models.config import ModelConfig
from mtpx.models.model import MTPForCausalLM

__all__ = ["ModelConfig", "MTPForCausalLM"]
