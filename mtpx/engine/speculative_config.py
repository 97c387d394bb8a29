"""vLLM's `speculative_config` ({"method": "mtp", "num_speculative_tokens": k, ...}) as mtpx's spec
and num_speculative_tokens (LLM(speculative_config=...))."""
from __future__ import annotations

import numbers

from mtpx.models.model import MTPForCausalLM

# vLLM's per-model MTP method names, which vLLM rewrites to "mtp" (mtpx: the same)
MTP_METHOD_ALIASES = ("deepseek_mtp", "mimo_mtp", "qwen3_next_mtp", "glm4_moe_mtp", "ernie_mtp",
                      "longcat_flash_mtp", "pangu_ultra_moe_mtp", "qwen3_5_mtp")
SPECULATIVE_CONFIG_KEYS = ("method", "num_speculative_tokens", "draft_path", "verify", "draft_sample_method",
                           "tree", "acceptance", "posterior_threshold", "posterior_alpha", "relaxed_topk",
                           "relaxed_delta", "lenient_lambda", "cascade_alpha", "synthetic_acceptance_rates",
                           "rejection_sample_method")
REJECTION_SAMPLE_METHODS = {"strict": "lossless", "probabilistic": "lossless", "synthetic": "synthetic"}
"""vLLM's rejection_sample_method as mtpx's acceptance (strict and probabilistic are both lossless)."""


def from_speculative_config(sc: dict, model) -> tuple[str, int | None, dict]:
    """vLLM's speculative_config {"method": "mtp", "num_speculative_tokens": k} as (spec,
    num_speculative_tokens, other keys). method "mtp" is multi-module MTP ("mtp8") when the model
    has more than one MTP module, else single-module MTP ("mtp1"), as vLLM applies its MTP
    layers (vLLM's per-model names, MTP_METHOD_ALIASES, mean "mtp"); "mtp1" and "mtp8" name
    mtpx's speculators directly. Raises ValueError naming an
    unknown key (and the closest) or method."""
    import difflib
    extra = dict(sc)
    for key in extra:
        if key not in SPECULATIVE_CONFIG_KEYS:
            close = difflib.get_close_matches(key, SPECULATIVE_CONFIG_KEYS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"use {', '.join(SPECULATIVE_CONFIG_KEYS)}"
            raise ValueError(f"unknown speculative_config key {key!r}: {hint}")
    if "rejection_sample_method" in extra:
        rsm = extra.pop("rejection_sample_method")
        if rsm not in REJECTION_SAMPLE_METHODS:
            raise ValueError(f"speculative_config rejection_sample_method {rsm!r}: choose one of "
                             f"{', '.join(REJECTION_SAMPLE_METHODS)} (or mtpx's acceptance key)")
        extra.setdefault("acceptance", REJECTION_SAMPLE_METHODS[rsm])
    method = extra.pop("method", "mtp")
    if method in MTP_METHOD_ALIASES:          # vLLM rewrites these to "mtp" too
        method = "mtp"
    k = extra.pop("num_speculative_tokens", None)
    if method == "mtp":
        if isinstance(model, MTPForCausalLM):
            n = model.cfg.num_nextn_predict_layers
        else:
            from mtpx.hf.loader import load_config
            n = load_config(model).num_nextn_predict_layers
        method = "mtp8" if n > 1 else "mtp1"
    if method not in ("mtp1", "mtp8"):
        raise ValueError(f"speculative_config method {method!r}: mtpx runs 'mtp' (or 'mtp1' / 'mtp8', or "
                         f"vLLM's {', '.join(MTP_METHOD_ALIASES)})")
    return method, k, extra


def check_num_speculative_tokens(k):
    """k when it is an integer >= 0 (0: decoding without speculation), None (the speculator's
    default) or "auto"; else ValueError, one line naming spec.num_speculative_tokens. The one check
    of this value: the spec group's (mtpx.schema) and LLM's both call it."""
    if k is None or (isinstance(k, str) and k == "auto"):
        return k
    if isinstance(k, numbers.Integral) and not isinstance(k, bool) and k >= 0:
        return k
    raise ValueError(f"spec.num_speculative_tokens={k!r}: give an integer >= 0, null or auto")
