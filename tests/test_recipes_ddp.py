"""The acceptance recipes under torchrun-style DDP (2 ranks, gloo): an LK loss on the live frozen
target and a KL loss on hidden-state shards give the losses and weights of one process with the
same global batch, within float32 summation order (1e-5, as tests/test_distributed.py).
Slow (`pytest -m slow tests/test_recipes_ddp.py`, about a minute on 2 cores)."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from mtpx.train import extract as extract_mod
from mtpx.train.loop import train
from tests.test_distributed import _close, _free_port, _spawn, _train_rows
from tests.test_train import run_cfg, write_synthetic_gsm8k


@pytest.mark.slow
def test_lk_and_shard_recipes_under_ddp_match_one_process(tmp_path):
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl", n=120)
    src = train(run_cfg(tmp_path, "target", steps=2, eval_every=0))
    hs = tmp_path / "hs"
    cfg = run_cfg(tmp_path, "unused", hidden_states_path=str(hs), hidden_states_top_k=320)
    cfg["model"]["path"] = str(src)
    assert extract_mod.run_extract(OmegaConf.create(cfg)) == 0

    def job(out, **kw):
        c = run_cfg(tmp_path, out, steps=4, eval_every=2, freeze_base=True, **kw)
        c["model"]["path"] = str(src)
        return c

    recipes = {"lk": dict(mtp_loss="lk_hybrid"), "shards": dict(mtp_loss="kl", hidden_states_path=str(hs))}
    _spawn([{**job(f"ddp_{n}", parallel="ddp", **kw), "port": _free_port()} for n, kw in recipes.items()])
    for name, kw in recipes.items():
        one = train(job(f"one_{name}", **kw))
        _close(_train_rows(one), _train_rows(tmp_path / f"ddp_{name}"))
        a, b = load_file(one / "model.safetensors"), load_file(tmp_path / f"ddp_{name}" / "model.safetensors")
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5, msg=k)
