"""The draft-module chains training scores (mtpx/train/losses.py picks one): what each depth's module
reads, and which attention context it sees.

All take input_ids [B, T] int64 and the target's hidden states h [B, T, H], and return
[a^1 [B, T-1, H], ..., a^D [B, T-D, H]]: a^k_j (j = 0..T-1-k) predicts x_{j+k+1}.

- `unrolled_chain`: depth k run by module `modules[k-1]` on a^{k-1}_j and the teacher-forced x_{j+k},
  one causal pass per depth at RoPE position j (MTPForCausalLM.mtp_chain's ops for
  modules = [0, 1, ..]; vLLM speculators' MTP trainer and FastMTP for modules = [0, 0, ..]).
- `ttt_chain`: single-module MTP with EAGLE-3's training-time test (arXiv 2503.01840, §3.3): step
  k of anchor j runs where mtp1 runs it at inference (mtpx/spec_decode/single_module.py), at RoPE
  position j + k - 1, and attends to what the module's KV holds there: step 1's keys at positions
  0..j (computed from the target's hidden states) and the keys of the same anchor's steps 2..k at
  positions j + 1 .. j + k - 1 (a causal prefix plus a diagonal per earlier step, EAGLE-3's mask).
- `target_input_chain`: teacher forcing of the hidden input: module k reads the target's
  h_{j+k-1} instead of module k-1's output (each module trained as if every earlier depth had
  been exact), at RoPE position j.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpx.attention.torch_backend import causal_attention
from mtpx.models.model import MTPForCausalLM


def unrolled_chain(model: MTPForCausalLM, input_ids: torch.Tensor, hidden: torch.Tensor,
                   modules: list[int]) -> list[torch.Tensor]:
    """`MTPForCausalLM.mtp_chain` with depth k run by module `modules[k-1]` (the same ops in the
    same order; module doc)."""
    B, T = input_ids.shape
    emb_all = model.model.embed_tokens(input_ids)
    outs, a = [], hidden
    for k, m in enumerate(modules, start=1):
        positions = torch.arange(T - k, device=input_ids.device)[None].expand(B, -1)
        a = model.mtp[m](emb_all[:, k:], a[:, : T - k], positions)
        outs.append(a)
    return outs


def target_input_chain(model: MTPForCausalLM, input_ids: torch.Tensor, hidden: torch.Tensor,
                       num_modules: int) -> list[torch.Tensor]:
    """Module k on (x_{j+k}, h_{j+k-1}) at RoPE position j (module doc: teacher forcing)."""
    B, T = input_ids.shape
    emb_all = model.model.embed_tokens(input_ids)
    outs = []
    for k in range(1, num_modules + 1):
        positions = torch.arange(T - k, device=input_ids.device)[None].expand(B, -1)
        outs.append(model.mtp[k - 1](emb_all[:, k:], hidden[:, k - 1: T - 1], positions))
    return outs


class TTTAttention:
    """The attention of a `ttt_chain`: GatedAttention hands it q [B, L, H, D] and k, v [B, L, Hkv,
    D] (normed and rotated) of each step in turn, through ForwardMeta.attn_backend's interface
    `forward(q, k, v, cache, meta)`. Step 1 is causal; step s >= 2 (L = T - s anchors) attends
    to step 1's keys 0..j and to the keys of steps 2..s at anchor j (module doc), with the scale
    D^-0.5 and grouped-query heads (query head h reads kv head h // (H / Hkv), as SDPA's
    enable_gqa)."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def forward(self, q, k, v, cache, meta):
        self.keys.append(k)
        self.values.append(v)
        if len(self.keys) == 1:
            return causal_attention(q, k, v)
        B, L, H, D = q.shape
        rep = H // k.shape[2]
        qf = q.float().transpose(1, 2) * D ** -0.5                           # [B, H, L, D]
        k1 = self.keys[0][:, :L].float().repeat_interleave(rep, 2).transpose(1, 2)
        v1 = self.values[0][:, :L].float().repeat_interleave(rep, 2).transpose(1, 2)
        prefix = qf @ k1.transpose(-1, -2)                                    # [B, H, L, L]
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        prefix = prefix.masked_fill(~causal, float("-inf"))
        ks = torch.stack([x[:, :L].float().repeat_interleave(rep, 2).transpose(1, 2)
                          for x in self.keys[1:]], -2)                        # [B, H, L, S, D]
        vs = torch.stack([x[:, :L].float().repeat_interleave(rep, 2).transpose(1, 2)
                          for x in self.values[1:]], -2)
        diag = (qf[..., None, :] * ks).sum(-1)                                # [B, H, L, S]
        probs = torch.softmax(torch.cat([prefix, diag], -1), -1)
        out = probs[..., :L] @ v1 + (probs[..., L:, None] * vs).sum(-2)       # [B, H, L, D]
        return out.transpose(1, 2).to(q.dtype)


@dataclass
class _TTTMeta:
    """What the module and its layer read of a ForwardMeta on this path: no compiled region, no
    packing, the attention backend."""

    attn_backend: TTTAttention
    compile_regions: bool = False
    packed: None = None


_NO_CACHE = object()   # GatedAttention asks the backend only when given a cache; TTTAttention keeps its own


def ttt_chain(model: MTPForCausalLM, input_ids: torch.Tensor, hidden: torch.Tensor,
              steps: int) -> list[torch.Tensor]:
    """Module 0 applied `steps` times with inference's positions and attention context (module
    doc: EAGLE-3's training-time test)."""
    B, T = input_ids.shape
    emb_all = model.model.embed_tokens(input_ids)
    meta = _TTTMeta(TTTAttention())
    outs, a = [], hidden
    for k in range(1, steps + 1):
        positions = (torch.arange(T - k, device=input_ids.device) + (k - 1))[None].expand(B, -1)
        a = model.mtp[0](emb_all[:, k:], a[:, : T - k], positions, _NO_CACHE, meta)
        outs.append(a)
    return outs
