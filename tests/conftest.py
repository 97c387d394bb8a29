import pytest
import torch

from mtpx.models import ModelConfig, MTPForCausalLM


def tiny_config(**overrides) -> ModelConfig:
    """A tiny hybrid (DeltaNet, attention, DeltaNet, attention) with 4 MTP modules, vocab 64."""
    base = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, full_attention_interval=2, num_nextn_predict_layers=4,
                max_position_embeddings=256)
    base.update(overrides)
    return ModelConfig(**base)


def peaked_model(cfg: ModelConfig, seed: int = 0) -> MTPForCausalLM:
    """A float64 random model whose outputs are sharp enough that drafts often match the target
    (a scaled-up lm_head makes argmaxes depend on few dims that the draft modules share)."""
    torch.manual_seed(seed)
    m = MTPForCausalLM(cfg).double().eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(20)
    return m


@pytest.fixture
def tiny_model():
    return peaked_model(tiny_config())
