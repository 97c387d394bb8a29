"""The training objective: next-token CE of the target plus weighted per-depth MTP CEs.

    loss = main + sum_{k=1..D} w_k * CE_k,    w_k = mtp_loss_weight * mtp_loss_decay^(k-1)

main is the target's next-token cross-entropy (left out with a frozen target: train_base=False);
CE_k scores depth k, whose output a^k_j predicts x_{j+k+1} (mtpx/models/mtp.py). All CEs are means
over the batch's tokens in nats, in float32. Which module produces depth k:

- multi-module (mtp_unroll = 0, the default): module k-1, D = num_nextn_predict_layers, exactly
  `MTPForCausalLM.training_losses` (DeepSeek-V3 §2.2, arXiv 2412.19437; the same ops in the same
  order, so the losses are bit-identical).
- recursive unroll (mtp_unroll = D >= 1, single-module MTP): module 0 applied D times, each on its
  own previous output, as the mtp1 draft loop runs it (mtpx/spec_decode/single_module.py). Step k
  reads the TEACHER-FORCED token x_{j+k} and a^{k-1}_j, its own output of step k-1; every step is
  scored. This is vLLM speculators' MTP trainer (`speculators/models/mtp/core.py`: ground-truth
  input_ids[t+k+1] as the embedding input, the MTP output of step k-1 as the hidden input) and
  FastMTP's shared-weight recursion (arXiv 2509.18362). Inference's step k >= 2 reads the draft
  d_{k-1}, which equals x_{j+k} wherever step k's draft can still be accepted. What differs: each
  step here is one causal pass over the sequence at RoPE position j, so step k's attention keys
  hold step k-1's hidden states, not the target's (EAGLE-3's training-time test, arXiv 2503.01840,
  reproduces inference's mixed context with a custom mask; mtpx does not).

mtp_loss_decay < 1 weights later depths less. FastMTP (Eq. 2) normalises, alpha_k = beta^(k-1) /
sum_j beta^(j-1) (vLLM speculators' `compute_step_weights(beta=0.6)`): a constant that
mtp_loss_weight absorbs. decay = 1 is DeepSeek-V3's equal weighting (times mtp_loss_weight instead
of lambda / D).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtpx.models.model import MTPForCausalLM


def depth_modules(num_modules: int, mtp_unroll: int) -> list[int]:
    """Index of the draft module that produces each depth: [0, 1, ..., N-1], or [0] * mtp_unroll."""
    return [0] * mtp_unroll if mtp_unroll else list(range(num_modules))


def unrolled_chain(model: MTPForCausalLM, input_ids: torch.Tensor, hidden: torch.Tensor,
                   modules: list[int]) -> list[torch.Tensor]:
    """`MTPForCausalLM.mtp_chain` with depth k run by module `modules[k-1]` (the same ops in the
    same order). input_ids: [B, T]; hidden: [B, T, H] -> [a^1 [B, T-1, H], ..., a^D [B, T-D, H]]."""
    B, T = input_ids.shape
    emb_all = model.model.embed_tokens(input_ids)
    outs, a = [], hidden
    for k, m in enumerate(modules, start=1):
        positions = torch.arange(T - k, device=input_ids.device)[None].expand(B, -1)
        a = model.mtp[m](emb_all[:, k:], a[:, : T - k], positions)
        outs.append(a)
    return outs


def mtp_objective(model: MTPForCausalLM, input_ids: torch.Tensor, *, mtp_loss_weight: float,
                  mtp_loss_decay: float = 1.0, mtp_unroll: int = 0, train_base: bool = True):
    """The objective of the module doc on one batch.

    input_ids: [B, T] int64 with T >= D + 2 (D depths).
    train_base=False: the target runs under no_grad and `main` is reported but not in the loss.
    Returns (loss: scalar tensor, parts: {"main": float, "mtp1": float, ..., "mtpD": float}).

    Raises:
        ValueError: T < D + 2; mtp_unroll > 0 on a model without a draft module.
    """
    N, T = len(model.mtp), input_ids.shape[1]
    modules = depth_modules(N, mtp_unroll)
    if mtp_unroll and N < 1:
        raise ValueError("train.mtp_unroll needs a draft module: set model.num_nextn_predict_layers=1")
    D = len(modules)
    if T < D + 2:
        raise ValueError(f"seq_len {T} is too short for {D} MTP depths: use seq_len >= {D + 2}")
    with torch.set_grad_enabled(train_base and torch.is_grad_enabled()):
        h = model.model(input_ids)
        main = F.cross_entropy(model.lm_head(h[:, :-1]).flatten(0, 1).float(), input_ids[:, 1:].flatten())
    parts = {"main": main.item()}
    loss = main if train_base else main.new_zeros(())
    a0 = h if train_base else h.detach()
    # the multi-module chain is model.mtp_chain itself (bit-identical to training_losses)
    chain = unrolled_chain(model, input_ids, a0, modules) if mtp_unroll else model.mtp_chain(input_ids, a0, N)
    for k, (m, a) in enumerate(zip(modules, chain), start=1):
        logits = model.draft_logits(m, a[:, :-1])               # j = 0..T-2-k predicts x_{j+k+1}
        ce = F.cross_entropy(logits.flatten(0, 1).float(), input_ids[:, k + 1:].flatten())
        parts[f"mtp{k}"] = ce.item()
        loss = loss + (mtp_loss_weight * mtp_loss_decay ** (k - 1)) * ce
    return loss, parts


class Objective(nn.Module):
    """`mtp_objective` as a module's forward, so that data-parallel wrappers (DDP's gradient
    hooks, FSDP2's all-gather before and reshard after the forward) run around it:
    `Objective(model, ...)(input_ids, train_base) -> (loss, parts)`. `self.model` is the
    MTPForCausalLM (its parameter names get the prefix "model.")."""

    def __init__(self, model: MTPForCausalLM, *, mtp_loss_weight: float, mtp_loss_decay: float = 1.0,
                 mtp_unroll: int = 0):
        super().__init__()
        self.model = model
        self.weights = dict(mtp_loss_weight=mtp_loss_weight, mtp_loss_decay=mtp_loss_decay,
                            mtp_unroll=mtp_unroll)

    @property
    def num_depths(self) -> int:
        return len(depth_modules(len(self.model.mtp), self.weights["mtp_unroll"]))

    def forward(self, input_ids: torch.Tensor, train_base: bool = True):
        return mtp_objective(self.model, input_ids, train_base=train_base, **self.weights)
