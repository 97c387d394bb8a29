"""Tiny random Hugging Face `transformers` checkpoints for parity tests and benchmarks.

Each builder makes a small model of one family, perturbs every parameter with seeded noise (so
that norm weights are neither all ones nor all zeros and the RMSNorm conventions are really
tested; biases and the Gated DeltaNet `A_log`/`dt_bias` move too), rescales the output logits
to a fixed spread (so that greedy argmaxes are not near-ties), writes the model with
`save_pretrained` and returns `(folder, hf_model)`, where `hf_model` is the checkpoint read back
with `from_pretrained` in eval mode: both engines then run the very same saved tensors.

Families (`FAMILIES`, `build(name, folder)`):
- `qwen3_next_moe`: Qwen3NextForCausalLM, Gated DeltaNet + gated attention (layers
  linear, full, linear, full), 4 experts top-2 with a shared expert; `decoder_sparse_step=2` and
  `mlp_only_layers=[3]` leave MoE in layer 1 only and dense SwiGLU MLPs in layers 0, 2, 3;
  untied embeddings.
- `llama`: LlamaForCausalLM, GQA (8 heads, 2 kv heads), default RoPE, untied; saved in
  200 KB shards (model-0000i-of-0000n.safetensors + model.safetensors.index.json).
- `llama3_rope_bias`: LlamaForCausalLM with `rope_parameters` of type llama3 (its wavelength
  thresholds fall inside the rotary dims of this tiny model so all three llama3 regimes occur)
  and `attention_bias=True`, `mlp_bias=True`.
- `qwen3`: Qwen3ForCausalLM, per-head q/k RMSNorm (standard, weight init 1), tied embeddings.

`hf_greedy(model, input_ids, max_new_tokens)` runs transformers' greedy `generate` with eos
disabled and returns the new tokens and the per-step raw logits.

Used by tests/test_hf_parity.py and tools/bench_hf_generate.py (which puts the repository root
on sys.path and imports this module as `tests.hf_models`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

VOCAB = 512
LOGIT_STD = 4.0          # target std of the output logits after rescaling
MATRIX_NOISE = 0.1       # noise std added to every >= 2-D parameter (init std is 0.02): large
#                          enough that greedy outputs of these random models do not just repeat
VECTOR_NOISE = 0.2       # noise std added to 1-D parameters (norm weights, A_log, dt_bias, ...)
BIAS_NOISE = 0.02        # noise std added to Linear biases (`*.bias`; larger ones make the
#                          residual stream constant and the greedy output one repeated token)


def _common(**overrides) -> dict:
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=None)
    base.update(overrides)
    return base


def qwen3_next_moe_config(**overrides):
    """The tiny Qwen3-Next MoE config (also the benchmark's model)."""
    from transformers import Qwen3NextConfig
    kw = _common(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
        shared_expert_intermediate_size=64, norm_topk_prob=True,
        decoder_sparse_step=2, mlp_only_layers=[3],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    kw.update(overrides)
    return Qwen3NextConfig(**kw)


def llama_config(llama3_rope: bool = False, bias: bool = False, **overrides):
    from transformers import LlamaConfig
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if llama3_rope:
        # head_dim 16, theta 1e4: wavelengths 2*pi*theta^(2i/16) = 6.3, 19.9, 63, 199, ...;
        # high_freq_wavelen = 64/4 = 16, low_freq_wavelen = 64/1 = 64: dim pair 0 is kept,
        # pairs 1-2 are smoothed, pairs 3-7 are divided by `factor`.
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
    kw = _common(num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                 rope_parameters=rope, attention_bias=bias, mlp_bias=bias,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    kw.update(overrides)
    return LlamaConfig(**kw)


def qwen3_config(**overrides):
    from transformers import Qwen3Config
    kw = _common(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                 tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)
    kw.update(overrides)
    return Qwen3Config(**kw)


@torch.no_grad()
def perturb_(model, seed: int, logit_std: float = LOGIT_STD) -> None:
    """Add seeded Gaussian noise to every parameter, then rescale the logits to std `logit_std`
    on a fixed random batch: via lm_head when untied, via the final norm's weight when tied
    (Qwen3's final norm is standard, x * w: scaling w scales the logits)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.dim() >= 2:
            std = MATRIX_NOISE
        else:
            std = BIAS_NOISE if name.endswith(".bias") else VECTOR_NOISE
        p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * std)
    ids = torch.randint(0, model.config.vocab_size, (2, 32), generator=g)
    logits = model(input_ids=ids).logits
    scale = logit_std / logits.float().std().item()
    if model.config.tie_word_embeddings:
        if model.config.model_type == "qwen3_next":
            raise ValueError("tied Qwen3-Next: zero-centred final norm, rescale not implemented")
        model.model.norm.weight.mul_(scale)
    else:
        model.lm_head.weight.mul_(scale)


def _save_and_reload(model_cls, cfg, folder: str | Path, seed: int, max_shard_size=None, **load_kw):
    folder = Path(folder)
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    perturb_(model, seed + 1)
    model.save_pretrained(folder, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
    hf = model_cls.from_pretrained(folder, dtype=torch.float32, **load_kw).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return folder, hf


def build_qwen3_next_moe(folder: str | Path, seed: int = 0, experts_implementation: str | None = None,
                         **cfg_overrides):
    """(folder, hf Qwen3NextForCausalLM). experts_implementation: transformers' MoE kernel for the
    returned model ("eager", "grouped_mm", ...; None: transformers' default)."""
    from transformers import Qwen3NextForCausalLM
    kw = {} if experts_implementation is None else {"experts_implementation": experts_implementation}
    return _save_and_reload(Qwen3NextForCausalLM, qwen3_next_moe_config(**cfg_overrides), folder, seed, **kw)


def build_llama(folder: str | Path, seed: int = 0, llama3_rope: bool = False, bias: bool = False,
                max_shard_size: str | int | None = None):
    """max_shard_size: e.g. "200KB" writes model-0000i-of-0000n.safetensors shards + index."""
    from transformers import LlamaForCausalLM
    return _save_and_reload(LlamaForCausalLM, llama_config(llama3_rope, bias), folder, seed,
                            max_shard_size=max_shard_size)


def build_qwen3(folder: str | Path, seed: int = 0):
    from transformers import Qwen3ForCausalLM
    return _save_and_reload(Qwen3ForCausalLM, qwen3_config(), folder, seed)


FAMILIES: dict[str, Callable] = {
    "qwen3_next_moe": lambda folder, seed=0: build_qwen3_next_moe(folder, seed),
    "llama": lambda folder, seed=0: build_llama(folder, seed, max_shard_size="200KB"),
    "llama3_rope_bias": lambda folder, seed=0: build_llama(folder, seed, llama3_rope=True, bias=True),
    "qwen3": lambda folder, seed=0: build_qwen3(folder, seed),
}


def build(name: str, folder: str | Path, seed: int = 0):
    """(folder, hf_model) for family `name` (a key of FAMILIES)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown family '{name}': choose one of {sorted(FAMILIES)}")
    return FAMILIES[name](folder, seed)


@torch.no_grad()
def hf_greedy(model, input_ids: torch.Tensor, max_new_tokens: int = 32):
    """transformers' greedy decoding with eos disabled. input_ids: [B, T] (no padding).
    Returns (new_tokens [B, max_new_tokens] int64, logits [B, max_new_tokens, vocab] float32):
    logits[:, j] are the raw logits that chose new_tokens[:, j]."""
    model.generation_config.eos_token_id = None
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                         max_new_tokens=max_new_tokens,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                         eos_token_id=None)
    new = out.sequences[:, input_ids.shape[1]:]
    if new.shape[1] != max_new_tokens or len(out.logits) != max_new_tokens:
        raise RuntimeError(f"generate stopped after {new.shape[1]} of {max_new_tokens} tokens")
    return new, torch.stack(out.logits, dim=1).float()


def min_top2_gap(logits: torch.Tensor) -> float:
    """Smallest (top-1 minus top-2) logit gap over all positions: how far greedy is from a tie."""
    top = logits.float().topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).min().item()


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((o for o in out if isinstance(o, torch.Tensor)), None)
    return getattr(out, "last_hidden_state", None)


@torch.no_grad()
def module_diffs(hf_model, mtpx_model, input_ids: torch.Tensor) -> list[tuple[str, float]]:
    """Diagnose a parity failure: run both models' full forward on input_ids [B, T] with forward
    hooks on every module whose name exists in both (mtpx's module names equal transformers':
    `model.embed_tokens`, `model.layers.N.input_layernorm`, `...self_attn`, `...linear_attn`,
    `...mlp`, `model.norm`, `lm_head`, ...) and return [(name, max |mtpx - hf|)] in mtpx's
    execution order (modules whose outputs differ in shape give nan)."""
    hf_mods, mx_mods = dict(hf_model.named_modules()), dict(mtpx_model.named_modules())
    common = [n for n in mx_mods if n and n in hf_mods]
    hf_out, mx_out, order, handles = {}, {}, [], []

    def hook(store, name, record):
        def f(_mod, _inp, out):
            t = _first_tensor(out)
            if t is not None and name not in store:
                store[name] = t.detach().float().clone()
                if record:
                    order.append(name)
        return f

    for n in common:
        handles.append(hf_mods[n].register_forward_hook(hook(hf_out, n, False)))
        handles.append(mx_mods[n].register_forward_hook(hook(mx_out, n, True)))
    try:
        hf_model(input_ids=input_ids)
        mtpx_model(input_ids)
    finally:
        for h in handles:
            h.remove()
    diffs = []
    for n in order:
        a, b = mx_out[n], hf_out.get(n)
        if b is None or a.numel() != b.numel():
            diffs.append((n, float("nan")))
        else:
            diffs.append((n, (a.reshape(b.shape) - b).abs().max().item()))
    return diffs


def format_diffs(diffs: list[tuple[str, float]], tol: float) -> str:
    """The first modules over `tol` (or nan), as lines for an assertion message."""
    bad = [(n, d) for n, d in diffs if not d <= tol]
    head = bad[:8] if bad else diffs[-3:]
    return "\n".join(f"  {n}: max|diff| = {d:.3g}" for n, d in head)
