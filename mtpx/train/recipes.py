"""The train keys of the acceptance recipes, read and checked across keys: the per-depth loss and its
temperature, the training-time test, what each module reads, and frozen draft modules
(docs/training.md, "Recipes")."""
from __future__ import annotations

from omegaconf import DictConfig

from mtpx.models.model import MTPForCausalLM
from mtpx.train.losses import LossOptions


def loss_options(t: DictConfig, model: MTPForCausalLM) -> LossOptions:
    """The LossOptions of the train section `t` (its own ranges are mtpx.schema's). Raises
    ValueError naming the key: mtp_unroll_ttt without mtp_unroll, mtp_hidden_input=target with
    mtp_unroll, mtp_freeze_modules not below the model's module count."""
    unroll = int(t.get("mtp_unroll") or 0)
    ttt = bool(t.get("mtp_unroll_ttt") or False)
    hidden_input = str(t.get("mtp_hidden_input") or "chain")
    if ttt and not unroll:
        raise ValueError("train.mtp_unroll_ttt=true tests the unrolled steps of single-module MTP: set "
                         "train.mtp_unroll=K (K >= 1) with model.num_nextn_predict_layers=1, or drop it")
    if hidden_input == "target" and unroll:
        raise ValueError("train.mtp_hidden_input=target feeds module k the target's hidden state, but "
                         "train.mtp_unroll runs one module on its own outputs: use one of them")
    frozen = int(t.get("mtp_freeze_modules") or 0)
    if frozen and frozen >= len(model.mtp):
        raise ValueError(f"train.mtp_freeze_modules={frozen} freezes every one of the model's "
                         f"{len(model.mtp)} draft modules: raise model.num_nextn_predict_layers to add "
                         "modules to train, or lower train.mtp_freeze_modules")
    return LossOptions(mtp_loss=str(t.get("mtp_loss") or "ce"),
                       temperature=float(t.get("mtp_loss_temperature") or 1.0),
                       lk_eta=float(3.0 if t.get("lk_loss_eta") is None else t.lk_loss_eta),
                       mtp_unroll_ttt=ttt, mtp_hidden_input=hidden_input)


def freeze_modules(model: MTPForCausalLM, n: int) -> None:
    """requires_grad=False on draft modules 0..n-1 (train.mtp_freeze_modules): the optimizer then
    trains only the later ones, which read the frozen modules' outputs as at inference."""
    for m in model.mtp[:n]:
        for p in m.parameters():
            p.requires_grad_(False)
