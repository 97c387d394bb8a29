"""MTPForCausalLM: the target language model plus its `num_nextn_predict_layers` MTP draft modules.

Weight names follow Hugging Face Qwen3-Next: `model.embed_tokens`, `model.layers.N.{linear_attn,
self_attn,mlp,...}`, `model.norm`, `lm_head`; draft module k (0-based) lives under `mtp.k.` with
Qwen3-Next's MTP names (`fc`, `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `layers.0`, `norm`).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtpx.models.config import ModelConfig
from mtpx.models.decoder import DecoderModel
from mtpx.models.mtp import MTPModule
from mtpx.models.linear import Linear


class MTPForCausalLM(nn.Module):
    """Target LM (`model`, `lm_head`) plus `cfg.num_nextn_predict_layers` draft modules (`mtp`).
    With tie_word_embeddings, lm_head.weight is model.embed_tokens.weight."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        first = cfg.num_hidden_layers if cfg.mtp_style == "deepseek_v3" else 0
        self.mtp = nn.ModuleList([MTPModule(cfg, first + k) for k in range(cfg.num_nextn_predict_layers)])
        self.apply(self._init_weights)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for m in self.mtp:  # a "deepseek_v3" head starts as the target's lm_head
            if m.head is not None:
                m.head.weight = self.lm_head.weight

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.initializer_range)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def draft_logits(self, k: int, a: torch.Tensor) -> torch.Tensor:
        """Logits of draft module k (0-based) from its output a: [..., hidden] -> [..., vocab]
        (MTPModule.logits: the target's lm_head, or the module's own head for "deepseek_v3")."""
        return self.mtp[k].logits(a, self.lm_head)

    def cache_specs(self, num_draft_modules: int) -> tuple[list, list]:
        """What inference caches: (one KVCacheSpec or RecurrentStateSpec per target layer, one
        KVCacheSpec per draft module of the first num_draft_modules)."""
        return ([layer.cache_spec() for layer in self.model.layers],
                [m.layers[0].cache_spec() for m in self.mtp[:num_draft_modules]])

    # ---- parameter groups -------------------------------------------------------------------
    def mtp_parameters(self):
        """Parameters of the draft modules only (the embedding and lm_head are the target's)."""
        return self.mtp.parameters()

    def base_parameters(self):
        """Parameters of the target: embedding, decoder layers, final norm, lm_head."""
        seen = {id(p) for p in self.mtp.parameters()}
        return (p for p in self.parameters() if id(p) not in seen)

    # ---- reference (from-scratch) forwards --------------------------------------------------
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [B, T] int64 -> target logits [B, T, vocab] (no cache, positions 0..T-1)."""
        return self.lm_head(self.model(input_ids))

    def mtp_chain(self, input_ids: torch.Tensor, hidden: torch.Tensor, num_modules: int) -> list:
        """All draft modules over a whole sequence from scratch, as in training.

        input_ids: [B, T]; hidden: [B, T, hidden] target hidden states h_0..h_{T-1}.
        Returns [a^1, ..., a^num_modules], a^k of shape [B, T-k, hidden] covering j = 0..T-1-k
        (module k at index j reads x_{j+k}, so j + k <= T - 1).
        """
        T = input_ids.shape[1]
        if num_modules > len(self.mtp):
            raise ValueError(f"asked for {num_modules} MTP modules but the model has {len(self.mtp)}")
        emb_all = self.model.embed_tokens(input_ids)
        outs, a = [], hidden
        for k in range(1, num_modules + 1):
            positions = torch.arange(T - k, device=input_ids.device)[None].expand(input_ids.shape[0], -1)
            a = self.mtp[k - 1](emb_all[:, k:], a[:, : T - k], positions)
            outs.append(a)
        return outs

    def training_losses(self, input_ids: torch.Tensor, mtp_loss_weight: float = 0.3,
                        train_base: bool = True):
        """Joint MTP objective (DeepSeek-V3 §2.2): next-token cross-entropy of the target plus
        mtp_loss_weight * sum_k CE_k, where depth k predicts x_{j+k+1} from a^k_j.

        input_ids: [B, T] int64 with T >= num_nextn_predict_layers + 2.
        train_base=False: only the MTP terms (the target runs under no_grad: a frozen target).
        Returns (loss: scalar tensor, parts: {"main": float, "mtp1": float, ...}).
        """
        N, T = len(self.mtp), input_ids.shape[1]
        if T < N + 2:
            raise ValueError(f"seq_len {T} is too short for {N} MTP depths: use seq_len >= {N + 2}")
        with torch.set_grad_enabled(train_base and torch.is_grad_enabled()):
            h = self.model(input_ids)
            main = F.cross_entropy(self.lm_head(h[:, :-1]).flatten(0, 1).float(),
                                   input_ids[:, 1:].flatten())
        parts = {"main": main.item()}
        loss = main if train_base else main.new_zeros(())
        chain = self.mtp_chain(input_ids, h if train_base else h.detach(), N)
        for k, a in enumerate(chain, start=1):
            logits = self.draft_logits(k - 1, a[:, :-1])         # j = 0..T-2-k predicts x_{j+k+1}
            ce = F.cross_entropy(logits.flatten(0, 1).float(), input_ids[:, k + 1:].flatten())
            parts[f"mtp{k}"] = ce.item()
            loss = loss + mtp_loss_weight * ce
        return loss, parts
