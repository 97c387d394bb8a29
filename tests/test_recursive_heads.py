"""Multi-module heads trained as they are used (train.mtp_hidden_input, train.mtp_freeze_modules):
module k on module k-1's own outputs (the chain, as at inference) or on the target's hidden states
(teacher forcing), and modules added to a checkpoint trained behind frozen earlier ones."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mtpx.train import checkpoint as ckpt
from mtpx.train.loop import train
from mtpx.train.losses import LossOptions, mtp_objective
from tests.test_train import run_cfg, write_synthetic_gsm8k
from tests.test_train_recipes import _ce, _ids, _model


def test_teacher_forced_hidden_input_reads_the_targets_shifted_hidden_state():
    model, ids = _model(3), _ids()
    B, T = ids.shape
    with torch.no_grad():
        _, parts = mtp_objective(model, ids, mtp_loss_weight=0.3, train_base=False,
                                 options=LossOptions(mtp_hidden_input="target"))
        _, chained = mtp_objective(model, ids, mtp_loss_weight=0.3, train_base=False)
        h, emb = model.model(ids), model.model.embed_tokens(ids)
        for k in (1, 2, 3):   # module k on (x_{j+k}, h_{j+k-1}) at position j
            a = model.mtp[k - 1](emb[:, k:], h[:, k - 1: T - 1], torch.arange(T - k)[None].expand(B, -1))
            assert parts[f"mtp{k}"] == _ce(model, k - 1, a, ids, k).item()
    assert parts["mtp1"] == chained["mtp1"] and parts["mtp2"] != chained["mtp2"]


def test_modules_added_to_a_checkpoint_train_behind_a_frozen_first_module(tmp_path):
    """The post-hoc recipe: a 1-module checkpoint, two modules added (random init), the target and
    module 0 frozen; modules 1 and 2 train on module 0's (and then 1's) own outputs."""
    write_synthetic_gsm8k(tmp_path / "gsm8k.jsonl", n=120)
    first = run_cfg(tmp_path, "one", steps=2, eval_every=0)
    first["model"]["num_nextn_predict_layers"] = 1
    src = train(first)
    cfg = run_cfg(tmp_path, "three", steps=3, eval_every=0, freeze_base=True, mtp_freeze_modules=1,
                  mtp_loss="kl")
    cfg["model"].update(path=str(src), num_nextn_predict_layers=3)
    out = train(cfg)
    before, after = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert all(torch.equal(before[n], after[n]) for n in before)          # target and module 0 unmoved
    assert {n for n in after if n.startswith("mtp.2.")}
    model, _ = ckpt.load_model(out)
    assert len(model.mtp) == 3
    hist = ckpt.load_trainer_state(out)["loss_history"]
    assert {"mtp1", "mtp2", "mtp3"} <= set(hist[-1])
    bad = run_cfg(tmp_path, "bad", freeze_base=True, mtp_freeze_modules=3)
    bad["model"].update(path=str(src), num_nextn_predict_layers=3)
    with pytest.raises(ValueError, match="train.mtp_freeze_modules=3 freezes every one of the model's 3"):
        train(bad)
    bad = run_cfg(tmp_path, "bad2", mtp_unroll=2, mtp_hidden_input="target")
    bad["model"]["num_nextn_predict_layers"] = 1
    with pytest.raises(ValueError, match="train.mtp_hidden_input=target .* use one of them"):
        train(bad)
