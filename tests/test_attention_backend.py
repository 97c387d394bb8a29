"""The attention backend interface (mtpx.attention.backend), through the torch backend: one plan
per forward shared by every attention layer, the same outputs as the reference path, and clear
errors for backends this machine cannot run."""
import pytest
import torch

from mtpx.attention.backend import get_backend
from mtpx.attention.torch_backend import TorchBackend
from mtpx.cache.model_cache import ModelCache
from tests.helpers import peaked_model, tiny_config


class Counting(TorchBackend):
    def __init__(self):
        self.plans, self.forwards = 0, 0

    def plan(self, meta):
        self.plans += 1
        return ("plan", self.plans)

    def forward(self, q, k, v, cache, meta):
        assert meta.attn_plan == ("plan", self.plans)   # the plan of this forward reaches every layer
        self.forwards += 1
        return super().forward(q, k, v, cache, meta)


def test_one_plan_per_forward_and_reference_outputs():
    m = peaked_model(tiny_config())
    x = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(0))
    ref = m.model(x)
    cache = ModelCache(m, rows=3, max_len=32, num_draft_modules=0, block_size=8).static_block_tables()
    assert isinstance(cache.attention_backend, TorchBackend)
    cache.attention_backend = counting = Counting()
    rows = torch.arange(3)
    meta = cache.meta(torch.zeros(3, dtype=torch.long), torch.full((3,), 20), rows)
    h = m.model(x, meta, cache.target)
    num_attention = sum(t == "full_attention" for t in m.cfg.layer_types)
    assert (counting.plans, counting.forwards) == (1, num_attention)
    torch.testing.assert_close(h, ref, atol=1e-12, rtol=0)
    sub = meta.select(torch.tensor([2, 0]))                  # a subset is planned anew
    assert counting.plans == 2 and sub.attn_plan == ("plan", 2)


def test_backends_this_machine_cannot_run_name_the_fix():
    with pytest.raises(ValueError,
                       match="unknown engine.attention_backend 'xformers': choose one of torch, flashinfer"):
        get_backend("xformers", torch.device("cpu"))
    with pytest.raises(ValueError,
                       match="flashinfer needs a CUDA device .*use engine.attention_backend=torch"):
        get_backend("flashinfer", torch.device("cpu"))
