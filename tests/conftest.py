from pathlib import Path

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


def _synthetic_batch(g: torch.Generator, B: int, T: int) -> torch.Tensor:
    """Arithmetic sequences mod 60 (+ a noise token now and then): predictable several tokens ahead."""
    start = torch.randint(2, 62, (B, 1), generator=g)
    step = torch.randint(1, 4, (B, 1), generator=g)
    x = (start + step * torch.arange(T)) % 60 + 2
    noise = torch.rand(B, T, generator=g) < 0.1
    return torch.where(noise, torch.randint(2, 64, (B, T), generator=g), x)


# the dense-target conventions of Hugging Face Llama (mtpx.hf.config.FAMILIES)
LLAMA_FLAGS = dict(model_type="llama", layer_types=["full_attention"] * 4, attn_output_gate=False,
                   use_qk_norm=False, rms_norm_unit_offset=False, partial_rotary_factor=1.0)


def train_tiny(**overrides) -> MTPForCausalLM:
    """tiny_config(**overrides) trained jointly for 15 steps on arithmetic sequences, in float64."""
    torch.manual_seed(0)
    model = MTPForCausalLM(tiny_config(**overrides))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(15):  # few steps: drafts are accepted about half the time
        loss, _ = model.training_losses(_synthetic_batch(g, 16, 48), mtp_loss_weight=0.5)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.double().eval()


@pytest.fixture(scope="session")
def trained_tiny():
    return train_tiny()


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A tiny random checkpoint folder with a real byte-level BPE tokenizer (vocab 300)."""
    from mtpx.train.checkpoint import save_checkpoint
    from mtpx.train.tokenizer import train_tokenizer
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    tok = train_tokenizer(["def f(x):\n    return x + 1\n" * 50, "Question: what?\nAnswer: 42\n" * 50], 300)
    model = peaked_model(tiny_config(vocab_size=tok.get_vocab_size(), max_position_embeddings=1024)).float()
    save_checkpoint(path, model, tok)
    return path


def _shared_data():
    """shared/data next to the checkout (../shared/data, the configs' default) or inside it."""
    here = Path(__file__).resolve().parents[1]
    for root in (here.parent / "shared" / "data", here / "shared" / "data", Path("/work/shared/data")):
        if root.is_dir():
            return root
    return here.parent / "shared" / "data"


SHARED_DATA = _shared_data()
