"""Checkpoint folders: exact round trip, tied embeddings, save dtype, optimizer state, named errors,
and atomic replacement when a save fails halfway."""
from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
from safetensors.torch import load_file, save_file

from mtpx.models.config import ModelConfig
from mtpx.models.model import MTPForCausalLM
from mtpx.train.checkpoint import (
    CheckpointError,
    load_model,
    load_optimizer_state,
    load_trainer_state,
    save_checkpoint,
)
from mtpx.train.tokenizer import train_tokenizer

TINY = dict(
    vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16, num_nextn_predict_layers=2, max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["Question: what is 2 + 2?\nAnswer: 4\n#### 4"] * 50, 300)


def tiny_model(seed: int = 0, **over) -> MTPForCausalLM:
    torch.manual_seed(seed)
    return MTPForCausalLM(ModelConfig(**{**TINY, **over}))


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def test_round_trip_is_exact(tmp_path, tok):
    model = tiny_model()
    out = save_checkpoint(tmp_path / "ck", model, tok)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json"]
    loaded, tok2 = load_model(out)
    assert_same_weights(model, loaded)
    assert loaded.cfg == model.cfg and not loaded.training
    assert tok2.to_str() == tok.to_str()
    assert json.loads((out / "config.json").read_text()) == model.cfg.to_dict()


def test_tied_embeddings_store_one_tensor(tmp_path, tok):
    model = tiny_model(tie_word_embeddings=True)
    out = save_checkpoint(tmp_path / "ck", model, tok)
    names = load_file(out / "model.safetensors").keys()
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    loaded, _ = load_model(out)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert_same_weights(model, loaded)


def test_save_dtype_and_load_dtype(tmp_path, tok):
    model = tiny_model()
    out = save_checkpoint(tmp_path / "ck", model, tok, dtype=torch.bfloat16)
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    loaded, _ = load_model(out)  # upcast to float32 on load
    w, w2 = model.lm_head.weight, loaded.lm_head.weight
    assert w2.dtype == torch.float32 and torch.equal(w2, w.to(torch.bfloat16).float())
    loaded16, _ = load_model(out, dtype=torch.bfloat16)
    assert loaded16.lm_head.weight.dtype == torch.bfloat16


def test_optimizer_and_trainer_state_round_trip(tmp_path, tok):
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    loss, _ = model.training_losses(torch.randint(0, 300, (2, 16)))
    loss.backward()
    opt.step()
    out = save_checkpoint(tmp_path / "ck", model, tok, optimizer=opt,
                          trainer_state={"step": 1, "loss_history": [{"step": 1, "main": 5.0}]})
    state = load_trainer_state(out)
    assert state["step"] == 1 and state["loss_history"][0]["main"] == 5.0 and "optimizer" in state

    model2, _ = load_model(out)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3, betas=(0.9, 0.95))
    load_optimizer_state(out, opt2)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["state"].keys() == s2["state"].keys()
    for i in s1["state"]:
        for key, v in s1["state"][i].items():
            assert torch.equal(v, s2["state"][i][key]), (i, key)
    assert s2["param_groups"][0]["lr"] == 1e-3

    with pytest.raises(CheckpointError, match="parameters per group"):
        load_optimizer_state(out, torch.optim.AdamW(list(model2.mtp_parameters()), lr=1e-3))
    bare = save_checkpoint(tmp_path / "bare", model, tok)
    with pytest.raises(FileNotFoundError, match="has no trainer_state.json: it holds weights only"):
        load_trainer_state(bare)


# ---- errors ------------------------------------------------------------------------------------------


def test_missing_folder_and_files_are_named(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match="does not exist: point model.path"):
        load_model(tmp_path / "nowhere")
    out = save_checkpoint(tmp_path / "ck", tiny_model(), tok)
    (out / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no model.safetensors"):
        load_model(out)
    (out / "config.json").unlink()
    with pytest.raises(FileNotFoundError,
                       match="has no config.json: point model.path at a folder written by mode=train"):
        load_model(out)


def test_missing_and_unexpected_tensor_names_are_listed(tmp_path, tok):
    out = save_checkpoint(tmp_path / "ck", tiny_model(), tok)
    file = out / "model.safetensors"
    tensors = load_file(file)
    del tensors["mtp.1.fc.weight"]
    tensors["mtp.9.fc.weight"] = torch.zeros(1)
    save_file(tensors, file)
    with pytest.raises(CheckpointError, match=r"1 missing tensor\(s\) \[mtp\.1\.fc\.weight\]; "
                                              r"1 unexpected tensor\(s\) \[mtp\.9\.fc\.weight\]"):
        load_model(out)

    # a config with fewer MTP modules than the weights: many unexpected names, list truncated
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"0 missing tensor\(s\) \[\]; \d+ unexpected tensor\(s\) "
                                              r"\[mtp\.0\..*\(\+\d+ more\)\]"):
        load_model(out)


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path, tok):
    out = save_checkpoint(tmp_path / "ck", tiny_model(), tok)
    file = out / "model.safetensors"
    tensors = load_file(file)
    tensors["mtp.0.fc.weight"] = torch.zeros(32, 32)  # config says [32, 64]
    save_file(tensors, file)
    with pytest.raises(CheckpointError, match=r"tensor mtp\.0\.fc\.weight has shape \[32, 32\] but "
                                              r"config\.json implies \[32, 64\]"):
        load_model(out)


def test_unknown_config_key_is_named(tmp_path, tok):
    out = save_checkpoint(tmp_path / "ck", tiny_model(), tok)
    cfg = json.loads((out / "config.json").read_text())
    cfg["hiden_size"] = 1
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hiden_size"):
        load_model(out)


# ---- atomic write --------------------------------------------------------------------------------------


def _boom(*args, **kwargs):
    raise OSError("disk full (simulated)")


def test_failed_save_keeps_previous_checkpoint(tmp_path, tok, monkeypatch):
    first = tiny_model(seed=0)
    path = save_checkpoint(tmp_path / "ck", first, tok, trainer_state={"step": 1})
    before = {p.name: p.read_bytes() for p in path.iterdir()}

    monkeypatch.setattr(safetensors.torch, "save_file", _boom)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(path, tiny_model(seed=1), tok, trainer_state={"step": 2})
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # untouched, byte for byte
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temp folder left behind
    monkeypatch.undo()
    loaded, _ = load_model(path)
    assert_same_weights(first, loaded)
    assert load_trainer_state(path)["step"] == 1


def test_failed_first_save_leaves_no_folder(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(safetensors.torch, "save_file", _boom)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(tmp_path / "ck", tiny_model(), tok)
    assert list(tmp_path.iterdir()) == []


def test_resave_replaces_the_folder(tmp_path, tok):
    path = save_checkpoint(tmp_path / "ck", tiny_model(seed=0), tok, trainer_state={"step": 1})
    second = tiny_model(seed=1)
    save_checkpoint(path, second, tok)  # no trainer_state: the old one must not linger
    assert not (path / "trainer_state.json").exists()
    assert_same_weights(second, load_model(path)[0])
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_swap_interrupted_between_renames_points_at_the_backup(tmp_path, tok):
    path = save_checkpoint(tmp_path / "ck", tiny_model(), tok)
    path.rename(tmp_path / ".ck.old-1234")  # state after the first rename of the swap, before the second
    with pytest.raises(FileNotFoundError, match=r"\.ck\.old-1234 does.*rename it to ck"):
        load_model(path)
