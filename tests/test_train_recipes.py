"""MTP training recipes (mtpx/train/losses.py, train.mtp_*): per-depth loss decay, the recursive
unroll of single-module MTP, modules sharing one fc for the Qwen3-Next layout, and a frozen
target that stays frozen when a draft head is tied to its lm_head.

Expected losses are recomputed by hand from the model's blocks, in the same op order, and
compared with torch.equal: the recipes change weights and wiring, never the arithmetic."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from mtpx.hf.loader import load_pretrained
from mtpx.models import ModelConfig, MTPForCausalLM
from mtpx.train import checkpoint as ckpt
from mtpx.train.losses import mtp_objective
from mtpx.train.loop import train
from mtpx.train.tokenizer import train_tokenizer
from tests.test_train import TINY_MODEL, run_cfg, write_synthetic_gsm8k

ROOT = Path(__file__).resolve().parents[1]


def _model(num_modules: int, **kw) -> MTPForCausalLM:
    torch.manual_seed(0)
    return MTPForCausalLM(ModelConfig(**{**TINY_MODEL, "vocab_size": 64,
                                         "num_nextn_predict_layers": num_modules, **kw}))


def _ids(B: int = 3, T: int = 20) -> torch.Tensor:
    return torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))


def _ce(model, k_module: int, a: torch.Tensor, ids: torch.Tensor, depth: int) -> torch.Tensor:
    logits = model.draft_logits(k_module, a[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, depth + 1:].flatten())


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("recipes")
    write_synthetic_gsm8k(tmp / "gsm8k.jsonl")
    return tmp


# ---- the objective ---------------------------------------------------------------------------------


@pytest.mark.parametrize("train_base", [True, False])
def test_default_objective_is_bit_identical_to_training_losses(train_base):
    """decay 1, no unroll: the loss, every part and every gradient equal MTPForCausalLM.training_losses
    bit for bit (the single-process trajectory of a run does not move)."""
    ids = _ids()
    ref = _model(3)
    loss_a, parts_a = ref.training_losses(ids, mtp_loss_weight=0.3, train_base=train_base)
    loss_a.backward()
    new = _model(3)
    loss_b, parts_b = mtp_objective(new, ids, mtp_loss_weight=0.3, train_base=train_base)
    loss_b.backward()
    assert torch.equal(loss_a, loss_b) and parts_a == parts_b
    ga, gb = _grads(ref), _grads(new)
    assert ga.keys() == gb.keys() and all(torch.equal(ga[n], gb[n]) for n in ga)


def test_decay_weights_depth_k_by_decay_to_the_k_minus_1():
    model, ids = _model(3), _ids()
    with torch.no_grad():
        loss, parts = mtp_objective(model, ids, mtp_loss_weight=0.3, mtp_loss_decay=0.5)
        h = model.model(ids)
        main = F.cross_entropy(model.lm_head(h[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())
        ces = [_ce(model, k - 1, a, ids, k) for k, a in enumerate(model.mtp_chain(ids, h, 3), start=1)]
    # w_k = 0.3 * 0.5^(k-1) = 0.3, 0.15, 0.075
    expected = main + 0.3 * ces[0] + 0.15 * ces[1] + 0.075 * ces[2]
    assert torch.equal(loss, expected)
    assert parts == {"main": main.item(), **{f"mtp{k}": c.item() for k, c in enumerate(ces, start=1)}}
    # the same per-depth CEs as decay 1, only their weights move
    _, parts_1 = mtp_objective(model, ids, mtp_loss_weight=0.3)
    assert parts_1 == parts


def test_unroll_1_is_todays_single_module_loss():
    ids = _ids()
    ref = _model(1)
    loss_a, parts_a = ref.training_losses(ids, mtp_loss_weight=0.3)
    loss_a.backward()
    new = _model(1)
    loss_b, parts_b = mtp_objective(new, ids, mtp_loss_weight=0.3, mtp_unroll=1)
    loss_b.backward()
    assert torch.equal(loss_a, loss_b) and parts_a == parts_b
    ga, gb = _grads(ref), _grads(new)
    assert all(torch.equal(ga[n], gb[n]) for n in ga)


def test_unroll_applies_module_0_on_its_own_outputs_with_teacher_forced_tokens():
    model, ids = _model(1), _ids()
    B, T = ids.shape
    with torch.no_grad():
        loss, parts = mtp_objective(model, ids, mtp_loss_weight=0.3, mtp_loss_decay=0.5, mtp_unroll=3)
        h = model.model(ids)
        main = F.cross_entropy(model.lm_head(h[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())
        emb = model.model.embed_tokens(ids)
        a, ces = h, []
        for k in (1, 2, 3):  # step k reads the true x_{j+k} and a^{k-1}_j, module 0 every time
            pos = torch.arange(T - k)[None].expand(B, -1)
            a = model.mtp[0](emb[:, k:], a[:, : T - k], pos)
            ces.append(_ce(model, 0, a, ids, k))
    assert torch.equal(loss, main + 0.3 * ces[0] + 0.15 * ces[1] + 0.075 * ces[2])
    assert list(parts) == ["main", "mtp1", "mtp2", "mtp3"]
    assert parts["mtp3"] == ces[2].item()
    with pytest.raises(ValueError, match="too short for 3 MTP depths"):
        mtp_objective(model, ids[:, :4], mtp_loss_weight=0.3, mtp_unroll=3)


def test_train_with_decay_and_unroll_records_every_unrolled_depth(workdir):
    cfg = run_cfg(workdir, "unroll", steps=3, eval_every=0, mtp_unroll=2, mtp_loss_decay=0.5)
    cfg["model"]["num_nextn_predict_layers"] = 1
    out = train(cfg)
    hist = ckpt.load_trainer_state(out)["loss_history"]
    assert {"mtp1", "mtp2"} <= set(hist[-1]) and "mtp3" not in hist[-1]
    assert (out / "losses.csv").read_text().splitlines()[0] == "step,split,lr,loss,grad_norm,main,mtp1,mtp2"
    model, _ = ckpt.load_model(out)
    assert len(model.mtp) == 1
    cfg = run_cfg(workdir, "unroll_bad", mtp_unroll=2)  # two modules: which one would unroll?
    with pytest.raises(ValueError, match="train.mtp_unroll=2 .* set model.num_nextn_predict_layers=1"):
        train(cfg)
    with pytest.raises(ValueError, match=r"train.mtp_loss_decay=0: must be a number in \(0, 1\]"):
        train(run_cfg(workdir, "decay_bad", mtp_loss_decay=0))


# ---- shared fc: train, resume, export in the Qwen3-Next layout ----------------------------------------


def _export_cli():
    spec = importlib.util.spec_from_file_location("export_checkpoint",
                                                  ROOT / "tools" / "export_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def test_shared_fc_trains_resumes_and_exports_in_the_qwen3_next_layout(workdir, tmp_path):
    cfg = run_cfg(workdir, "shared", steps=3, eval_every=0, mtp_share_fc=True)  # 2 modules, qwen3_next style
    out = train(cfg)
    model, _ = ckpt.load_model(out)
    for part in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        a, b = model.mtp[0].get_submodule(part).weight, model.mtp[1].get_submodule(part).weight
        assert torch.equal(a, b), part
    assert not torch.equal(model.mtp[0].layers[0].mlp.down_proj.weight,
                           model.mtp[1].layers[0].mlp.down_proj.weight)
    # resume re-ties them (same optimizer parameter count) and keeps training one tensor
    cfg["train"]["steps"] = 4
    model, _ = ckpt.load_model(train(cfg))
    assert torch.equal(model.mtp[0].fc.weight, model.mtp[1].fc.weight)
    assert ckpt.load_trainer_state(out)["step"] == 4

    exported = tmp_path / "q3"
    assert _export_cli()([str(out), str(exported), "--layout", "qwen3_next"]) == 0
    names = load_file(exported / "model.safetensors").keys()
    assert sum(n.startswith("mtp.fc.") for n in names) == 1 and "mtp.layers.1.mlp.down_proj.weight" in names
    served, _ = load_pretrained(exported)
    ids = _ids(2, 16) % model.cfg.vocab_size
    with torch.no_grad():
        for m in (model, served):
            m.eval()
        ha, hb = model.model(ids), served.model(ids)
        assert torch.equal(ha, hb)
        for k, (a, b) in enumerate(zip(model.mtp_chain(ids, ha, 2), served.mtp_chain(ids, hb, 2))):
            assert torch.equal(model.draft_logits(k, a), served.draft_logits(k, b)), k

    bad = run_cfg(workdir, "shared_bad", mtp_share_fc=True)
    bad["model"]["mtp_style"] = "deepseek_v3"
    with pytest.raises(ValueError, match="train.mtp_share_fc=true .* set model.mtp_style=qwen3_next"):
        train(bad)


# ---- a frozen target stays frozen -------------------------------------------------------------------


def test_freeze_base_keeps_a_tied_deepseek_head_frozen(workdir):
    """mtp_style=deepseek_v3 ties each module's head to lm_head (and so to the embedding): with
    freeze_base the head is the target's and must not move."""
    tok = train_tokenizer([(workdir / "gsm8k.jsonl").read_text()], 320)
    torch.manual_seed(0)
    target = MTPForCausalLM(ModelConfig(**{**TINY_MODEL, "vocab_size": tok.get_vocab_size(),
                                            "mtp_style": "deepseek_v3", "tie_word_embeddings": True}))
    src = ckpt.save_checkpoint(workdir / "ds_target", target, tok)
    cfg = run_cfg(workdir, "ds_frozen", steps=3, eval_every=0, freeze_base=True)
    cfg["model"]["path"] = str(src)
    out = train(cfg)
    before, after = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    base = [k for k in before if not k.startswith("mtp.")]
    assert "model.embed_tokens.weight" in base and all(torch.equal(before[k], after[k]) for k in base)
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("mtp."))
