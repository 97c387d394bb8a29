"""The run config's sections as keyword arguments: the engine's and the speculator's for LLM, the
benchmark client's for generate() (concurrency, Poisson arrival times), one SamplingParams per
prompt, the checkpoint path, and max_tokens capped by the model length. Each group's checks are
mtpx.schema's (mtpx/schema/groups.py)."""
from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence

import numpy as np
from omegaconf import DictConfig, OmegaConf



from mtpx.data.prompts import Prompt
from mtpx.engine.config import with_overrides
from mtpx.engine.llm import DEFAULT_MODEL
from mtpx.core.sampling_params import SamplingParams
from mtpx.core.structured_outputs import StructuredOutputsParams
from mtpx import schema
from mtpx.engine.config import SPEC_KEYS
from mtpx.schema.groups import ClientConfig, GenerationConfig, SpecConfig, spec_engine_keys


def poisson_arrival_offsets(n: int, request_rate: float, seed: int) -> list[float] | None:
    """Arrival times (seconds after the start) of n requests at request_rate requests/s, as vLLM's
    benchmark client sends them: the first at 0, then exponential gaps of mean 1 / request_rate
    (a Poisson process), from numpy's generator seeded with `seed`. None for an infinite rate
    (all requests at once)."""
    if math.isinf(request_rate):
        return None
    gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, size=max(n - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:n]


def engine_args(engine: DictConfig) -> dict:
    """LLM keyword arguments from the engine config group, validated once by EngineConfig
    (mtpx.engine.config.with_overrides: one line naming the key, or the closest one); ranges
    that depend on the model or the speculator are checked by the engine."""
    values = OmegaConf.to_container(engine, resolve=True)
    with_overrides(None, **values)
    return values


def client_args(e: DictConfig, num_prompts: int, section: str = "eval") -> dict:
    """generate() keyword arguments of the benchmark client from its config section (eval or
    bench): max_concurrency (concurrency) and arrival_offsets (request_rate, seed). Raises
    ValueError naming section.key (mtpx.schema.groups.ClientConfig.client)."""
    v = ClientConfig.client(section, e)
    return dict(max_concurrency=v["concurrency"],
                arrival_offsets=poisson_arrival_offsets(num_prompts, v["request_rate"], v["seed"]))


def sampling_params(e: DictConfig, num_prompts: int, section: str = "eval",
                    output_lens: Sequence[int | None] | None = None) -> list[SamplingParams]:
    """One SamplingParams per prompt from the client's config section (eval or bench):
    max_tokens, temperature, top_k, top_p, min_p, and seed = seed + prompt index (reproducible
    sampled runs), checked by mtpx.schema.groups.GenerationConfig.sampling. output_lens[i], when not None,
    fixes prompt i's output length instead of max_tokens, with ignore_eos (random prompts). Raises
    ValueError naming section.key."""
    v = GenerationConfig.sampling(section, e)
    max_tokens, seed = v["max_tokens"], v["seed"]
    lens = list(output_lens) if output_lens is not None else [None] * num_prompts
    if len(lens) != num_prompts:
        raise ValueError(f"{num_prompts} prompts but {len(lens)} output lengths")
    so = structured_outputs(e, section)
    every = max(1, int(e.get("structured_outputs_every") or 1))
    return [SamplingParams(max_tokens=n or max_tokens, temperature=v["temperature"], top_k=v["top_k"],
                           top_p=v["top_p"], min_p=v["min_p"], seed=seed + i, ignore_eos=n is not None,
                           structured_outputs=so if i % every == 0 else None)
            for i, n in enumerate(lens)]


def structured_outputs(e: DictConfig, section: str):
    """The client section's structured_outputs as a StructuredOutputsParams (None when unset);
    ValueError naming section.structured_outputs for a malformed one."""
    raw = e.get("structured_outputs")
    if raw is None:
        return None
    value = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw
    try:
        if not isinstance(value, dict):
            raise TypeError("give one of its keys, e.g. {json: {type: object}} or {regex: '[a-z]+'}")
        return StructuredOutputsParams(**value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{section}.structured_outputs: {err}".replace("\n", " ")) from None


def spec_args(spec: DictConfig | None) -> dict:
    """LLM keyword arguments from the spec config: draft_sample_method, verify and the acceptance
    rule's keys (absent keys take SpecConfig's defaults); {} without a spec. Raises ValueError
    naming spec.KEY and the fix (mtpx.schema.groups.SpecConfig.check)."""
    if spec is None:
        return {}
    schema.check("spec", spec)
    return {**{key: getattr(SpecConfig, key) for key in SPEC_KEYS}, **spec_engine_keys(spec)}


def model_path(cfg: DictConfig):
    """cfg.model.path, or the demo checkpoint when it is null. Raises ValueError for an empty
    model.path (`model.path=` on the command line), which would otherwise run the demo."""
    path = cfg.model.get("path")
    if path is None:
        return DEFAULT_MODEL
    if not str(path).strip():
        raise ValueError("model.path is empty: give a checkpoint folder (model.path=DIR), or leave "
                         "model.path out to run the demo checkpoint")
    return path


def cap_max_tokens(prompts: list[Prompt], params: list[SamplingParams], max_model_len: int,
                    key: str) -> tuple[list[SamplingParams], int | None]:
    """params with max_tokens lowered to what each prompt leaves of max_model_len (the engine
    stops there anyway, finish_reason "length"), with one warning line naming `key` when any
    was (a prompt of max_model_len tokens or more fails alone, uncapped); returns (params, the largest capped
    max_tokens, or None when none was capped)."""
    capped = [dataclasses.replace(p, max_tokens=max(1, max_model_len - len(q.engine_input)),
                                  min_tokens=min(p.min_tokens, max(1, max_model_len - len(q.engine_input))))
              if q.output_len is None
              and len(q.engine_input) < max_model_len < len(q.engine_input) + p.max_tokens
              else p
              for q, p in zip(prompts, params)]
    changed = [c.max_tokens for c, p in zip(capped, params) if c is not p]
    if not changed:
        return params, None
    asked = max(p.max_tokens for p in params)
    print(f"warning: {key}={asked} exceeds max_model_len={max_model_len} (prompt + output) for "
          f"{len(changed)} of {len(params)} prompts: they stop at {max(changed)} output tokens at most "
          f"(finish_reason length); lower {key} or raise engine.max_model_len", file=sys.stderr)
    return capped, max(changed)
