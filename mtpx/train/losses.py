"""The training objective: the target's next-token CE plus weighted per-depth MTP losses.

    loss = main + sum_{k=1..D} w_k * L_k,    w_k = mtp_loss_weight * mtp_loss_decay^(k-1)

main is the target's next-token cross-entropy (left out with a frozen target: train_base=False);
L_k scores depth k, whose output a^k_j predicts x_{j+k+1} (mtpx/models/mtp.py): the CE on the data
(train.mtp_loss=ce, the default) or a distance between the draft's and the target's distributions
for that token, kl | tv | lk_hybrid | lk_nll (mtpx/train/acceptance_losses.py, sources there).
All are means over the batch's tokens in float32. Which module produces depth k, and what it
reads (mtpx/train/chains.py):

- multi-module (mtp_unroll = 0, the default): module k-1, D = num_nextn_predict_layers, exactly
  `MTPForCausalLM.training_losses` with ce (DeepSeek-V3 §2.2, arXiv 2412.19437; the same ops in
  the same order, so the losses are bit-identical). Module k reads module k-1's output, as at
  inference; mtp_hidden_input=target feeds it the target's h_{j+k-1} instead (teacher forcing).
- recursive unroll (mtp_unroll = D >= 1, single-module MTP): module 0 applied D times, each on its
  own previous output, as the mtp1 draft loop runs it (mtpx/spec_decode/single_module.py). Step k
  reads the TEACHER-FORCED token x_{j+k} and a^{k-1}_j, its own output of step k-1; every step is
  scored. This is vLLM speculators' MTP trainer (`speculators/models/mtp/core.py`: ground-truth
  input_ids[t+k+1] as the embedding input, the MTP output of step k-1 as the hidden input) and
  FastMTP's shared-weight recursion (arXiv 2509.18362). Inference's step k >= 2 reads the draft
  d_{k-1}, which equals x_{j+k} wherever step k's draft can still be accepted. By default each
  step is one causal pass over the sequence at RoPE position j, so step k's attention keys hold
  step k-1's hidden states, not the target's; mtp_unroll_ttt=true runs EAGLE-3's training-time
  test instead (arXiv 2503.01840): inference's positions and attention context (chains.ttt_chain).

mtp_loss_decay < 1 weights later depths less. FastMTP (Eq. 2) normalises, alpha_k = beta^(k-1) /
sum_j beta^(j-1) (vLLM speculators' `compute_step_weights(beta=0.6)`): a constant that
mtp_loss_weight absorbs. decay = 1 is DeepSeek-V3's equal weighting (times mtp_loss_weight instead
of lambda / D).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtpx.models.model import MTPForCausalLM
from mtpx.train.acceptance_losses import TopK, depth_loss, target_log_probs
from mtpx.train.chains import target_input_chain, ttt_chain, unrolled_chain


def depth_modules(num_modules: int, mtp_unroll: int) -> list[int]:
    """Index of the draft module that produces each depth: [0, 1, ..., N-1], or [0] * mtp_unroll."""
    return [0] * mtp_unroll if mtp_unroll else list(range(num_modules))


@dataclass(frozen=True)
class LossOptions:
    """How the per-depth terms are formed (the train keys of the same names; module doc).

    mtp_loss: one of MTP_LOSSES (mtpx/train/acceptance_losses.py); temperature: of both
    distributions for every loss but ce (> 0); lk_eta: LK^lambda's eta (>= 0); mtp_unroll_ttt:
    the unrolled steps run with inference's context (chains.ttt_chain); mtp_hidden_input:
    "chain" (module k reads module k-1's output, as at inference) or "target" (teacher forcing:
    the target's hidden state, chains.target_input_chain)."""

    mtp_loss: str = "ce"
    temperature: float = 1.0
    lk_eta: float = 3.0
    mtp_unroll_ttt: bool = False
    mtp_hidden_input: str = "chain"


def _chain(model: MTPForCausalLM, input_ids: torch.Tensor, a0: torch.Tensor, modules: list[int],
           mtp_unroll: int, opts: LossOptions) -> list[torch.Tensor]:
    if mtp_unroll and opts.mtp_unroll_ttt:
        return ttt_chain(model, input_ids, a0, mtp_unroll)
    if mtp_unroll:
        return unrolled_chain(model, input_ids, a0, modules)
    if opts.mtp_hidden_input == "target":
        return target_input_chain(model, input_ids, a0, len(modules))
    # the multi-module chain is model.mtp_chain itself (bit-identical to training_losses)
    return model.mtp_chain(input_ids, a0, len(modules))


def teacher_log_probs(main_logits: torch.Tensor, temperature: float,
                      topk: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The target's log-probs at the temperature for the tokens x_1..x_{T-1}, without gradient:
    from its logits main_logits [B, T-1, V] -> [B, T-1, V] float32; or from a shard's top-k
    (values [B, T, K] log-probs, indices [B, T, K]): the tempered distribution restricted to those
    K tokens and renormalised -> TopK of [B, T-1, K] (p = 0 elsewhere)."""
    with torch.no_grad():
        if topk is None:
            return target_log_probs(main_logits.detach(), temperature)
        values, indices = topk
        return TopK(F.log_softmax(values[:, :-1].float() / temperature, dim=-1), indices[:, :-1].long())


def _depth_teacher(teacher, k: int):
    """The teacher for depth k's positions (x_{k+1}..): [N, V] or a TopK of [N, K]; None for ce."""
    if teacher is None:
        return None
    if isinstance(teacher, TopK):
        return TopK(teacher.values[:, k:].flatten(0, 1), teacher.indices[:, k:].flatten(0, 1))
    return teacher[:, k:].flatten(0, 1)


def mtp_objective(model: MTPForCausalLM, input_ids: torch.Tensor, *, mtp_loss_weight: float,
                  mtp_loss_decay: float = 1.0, mtp_unroll: int = 0, train_base: bool = True,
                  options: LossOptions = LossOptions(), hidden: torch.Tensor | None = None,
                  topk: tuple[torch.Tensor, torch.Tensor] | None = None):
    """The objective of the module doc on one batch.

    input_ids: [B, T] int64 with T >= D + 2 (D depths).
    train_base=False: the target runs under no_grad and `main` is reported but not in the loss.
    hidden: the target's final hidden states [B, T, H] (from hidden-state shards: the target's
    layers do not run; needs train_base=False); topk: the target's top-k log-probs (values,
    indices [B, T, K]) for the distribution losses, else they come from lm_head(hidden).
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
        h = model.model(input_ids) if hidden is None else hidden
        main_logits = model.lm_head(h[:, :-1])
        main = F.cross_entropy(main_logits.flatten(0, 1).float(), input_ids[:, 1:].flatten())
    parts = {"main": main.item()}
    loss = main if train_base else main.new_zeros(())
    a0 = h if train_base else h.detach()
    chain = _chain(model, input_ids, a0, modules, mtp_unroll, options)
    teacher = (None if options.mtp_loss == "ce"
               else teacher_log_probs(main_logits, options.temperature, topk))
    for k, (m, a) in enumerate(zip(modules, chain), start=1):
        logits = model.draft_logits(m, a[:, :-1])               # j = 0..T-2-k predicts x_{j+k+1}
        term = depth_loss(options.mtp_loss, logits.flatten(0, 1), input_ids[:, k + 1:].flatten(),
                          _depth_teacher(teacher, k),
                          options.temperature, options.lk_eta)
        parts[f"mtp{k}"] = term.item()
        loss = loss + (mtp_loss_weight * mtp_loss_decay ** (k - 1)) * term
    return loss, parts


class Objective(nn.Module):
    """`mtp_objective` as a module's forward, so that data-parallel wrappers (DDP's gradient
    hooks, FSDP2's all-gather before and reshard after the forward) run around it:
    `Objective(model, ...)(input_ids, train_base) -> (loss, parts)`. `self.model` is the
    MTPForCausalLM (its parameter names get the prefix "model.")."""

    def __init__(self, model: MTPForCausalLM, *, mtp_loss_weight: float, mtp_loss_decay: float = 1.0,
                 mtp_unroll: int = 0, options: LossOptions = LossOptions()):
        super().__init__()
        self.model = model
        self.weights = dict(mtp_loss_weight=mtp_loss_weight, mtp_loss_decay=mtp_loss_decay,
                            mtp_unroll=mtp_unroll, options=options)

    @property
    def num_depths(self) -> int:
        return len(depth_modules(len(self.model.mtp), self.weights["mtp_unroll"]))

    def forward(self, input_ids: torch.Tensor, train_base: bool = True, hidden: torch.Tensor | None = None,
                topk: tuple[torch.Tensor, torch.Tensor] | None = None):
        return mtp_objective(self.model, input_ids, train_base=train_base, hidden=hidden, topk=topk,
                             **self.weights)
