"""The config groups' structured configs, torchtitan-style: a default and a docstring per field,
`Literal` for the keys with fixed choices, and every range check of a group in its `check`
classmethod (one line naming the key and the fix). The YAML files of conf/ only override these
defaults. The engine group is mtpx.engine.config.EngineConfig (checked in its __post_init__), the
demo model group mtpx.models.config.ModelConfig's fields (mtpx/schema/__init__.py).

OmegaConf has no `Literal`: the ConfigStore gets a copy of each class with `str` in its place
(mtpx.schema.omegaconf_node), and `check` tests the choices.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

from omegaconf import MISSING, OmegaConf

from mtpx.engine.config import SPEC_KEYS, EngineConfig
from mtpx.engine.speculative_config import check_num_speculative_tokens
from mtpx.models.config import check_choice, literal_choices
from mtpx.spec_decode.acceptance import AcceptanceConfig
from mtpx.schema.options import (BuiltinData, ChatData, DemoLoading, FileData, GSM8KData, HFModel,  # noqa: F401
                                 NoLogger, RandomData, WandbLogger)

__all__ = ["RunConfig", "SpecConfig", "GenerationConfig", "ClientConfig", "BenchConfig", "EvalConfig",
           "ServeConfig", "DistillConfig", "BuiltinData", "FileData", "GSM8KData",
           "ChatData", "RandomData", "DemoLoading", "HFModel", "NoLogger", "WandbLogger", "int_or_none",
           "number", "literal_choices", "check_group"]


# --------------------------------------------------------------------------------------------------
# the checks every group uses (each raises ValueError with one line naming SECTION.KEY)


def int_or_none(section: str, cfg, key: str, minimum: int, null_means: str | None = None) -> int | None:
    """cfg[key] as an int >= minimum, or None when null is allowed (null_means says what it
    means); ValueError naming section.key otherwise."""
    value = cfg.get(key)
    if value is None and null_means is not None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        null = f", or null ({null_means})" if null_means is not None else ""
        raise ValueError(f"{section}.{key}={value!r}: must be an integer >= {minimum}{null}")
    return value


def number(section: str, cfg, key: str, ok: Callable[[float], bool], requirement: str) -> float:
    """cfg[key] as a float for which ok(value) holds; ValueError naming section.key otherwise."""
    raw = cfg.get(key)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(raw, bool) or not ok(value):
        raise ValueError(f"{section}.{key}={raw!r}: must be {requirement}")
    return value


class _Group:
    """check(section, cfg): the group's checks on a DictConfig (or dict) of its keys; the base
    checks every Literal field's choices ("SECTION.KEY='x': choose one of a, b") except those in
    `_checked_elsewhere` (each value is checked in one place)."""

    _choose = "choose one of"
    _checked_elsewhere: tuple[str, ...] = ()

    @classmethod
    def check(cls, section: str, cfg) -> None:
        for key, choices in literal_choices(cls).items():
            if key in cfg and key not in cls._checked_elsewhere:
                check_choice(f"{section}.{key}" if section else key, cfg.get(key), choices, cls._choose)


def check_group(section: str, cls: type, cfg) -> None:
    """Run `cls.check(section, cfg)` when cls has checks (the schemas of mtpx/schema)."""
    if issubclass(cls, _Group):
        cls.check(section, cfg)


# --------------------------------------------------------------------------------------------------
# the root and the speculator


@dataclass
class RunConfig(_Group):
    """The root: mode and seed, and one node per config group (`spec` only with `+spec=NAME`);
    `check("", cfg)` checks mode (mtpx.cli before it dispatches)."""
    mode: Literal["eval", "bench", "train", "serve", "distill", "extract"] = "eval"
    """What the run does: eval (decode a prompt set, report spec-decode metrics and check
    losslessness), bench (the serving benchmark), train, serve (the HTTP server), distill or
    extract (the target's hidden states for head training, mtpx/train/extract.py)."""
    seed: int = 0
    """The run's seed (model init and data order in mode=train)."""
    data_dir: str = MISSING
    """The data directory of the public data sets (gsm8k/, spec_bench/, mt_bench/, humaneval/),
    which the data and train groups' paths start from; MTPX_DATA_DIR or data_dir=DIR sets it."""
    model: Any = MISSING
    """The model group (`model=demo` or `model=hf`)."""
    data: Any = MISSING
    """The prompt set (the data group)."""
    train: Any = MISSING
    """mode=train's settings (the train group)."""
    engine: Any = MISSING
    """The engine's settings (EngineConfig)."""
    eval: Any = MISSING
    """mode=eval's client and checks (the eval group)."""
    bench: Any = MISSING
    """mode=bench's client (the bench group)."""
    serve: Any = MISSING
    """mode=serve's HTTP server (the serve group)."""
    distill: Any = MISSING
    """mode=distill's settings (the distill group)."""
    logger: Any = MISSING
    """Where metrics are logged besides the run folder (the logger group)."""
    spec: Any = None
    """The speculator (`+spec=NAME`); null: decoding without speculation."""


@dataclass
class SpecConfig(_Group, AcceptanceConfig):
    """The speculator (`+spec=NAME`). method is checked by mtpx.spec_decode.build_speculator,
    verify, draft_sample_method and the acceptance rule's keys (AcceptanceConfig) by EngineConfig,
    num_speculative_tokens by
    mtpx.engine.speculative_config.check_num_speculative_tokens (each in one place)."""
    method: Literal["mtp1", "mtp8"] = MISSING
    """mtp1 (single-module MTP: module 0 applied num_speculative_tokens times) or mtp8
    (multi-module MTP: module i drafts the i-th token)."""
    num_speculative_tokens: Any = MISSING
    """Drafts per step (an integer >= 1), or auto: each step picks k in 0 .. every module (mtp1:
    0 .. 4) from online acceptance and measured step costs (mtpx/auto_k/)."""
    draft_sample_method: Literal["greedy", "probabilistic"] = "greedy"
    """How drafts are proposed at temperature > 0 (greedy decoding ignores it): greedy = the
    draft's argmax, verified as a one-hot draft distribution (as vLLM does); probabilistic =
    drafts sampled from the draft distribution."""
    verify: Literal["standard", "block"] = "standard"
    """How the target verifies them at temperature > 0: standard = token-level rejection sampling
    (Leviathan et al.); block = block verification (Sun et al., arXiv 2403.10444): as many
    accepted tokens or more on average."""
    tree: Any = None
    """Tree drafting (docs/trees.md): null (a chain of num_speculative_tokens drafts), a list of
    widths per depth ([3, 2, 1]: the draft's top-3 at depth 1, the top-2 children of each, ...) or
    a list of paths of sibling ranks ([[0], [1], [0, 0]], Medusa / EAGLE "choices"), or the dynamic
    form {num_draft_tokens: 10, depth: 5, topk: 2} (EAGLE-2: each step the 10 drafts of highest
    cumulative draft log-probability, the top-2 nodes of each depth expanded). With a tree, leave
    num_speculative_tokens null. A chain plus sibling leaves ([[0], [1], [0, 0], [0, 1]]) drafts with
    the chain's round (compiled: its draft graph); dynamic trees run eager."""
    draft_path: Optional[str] = None
    """A safetensors file of MTP modules to attach to the target (a head trained in mtpx and
    exported with tools/export_checkpoint.py --layout draft, or any file in the mtpx, Qwen3-Next
    or DeepSeek layout); they replace the checkpoint's own modules. null = the checkpoint's."""
    cost_model_file: Optional[str] = None
    """With num_speculative_tokens=auto: a JSON file of the engine's step costs per (k, batch
    size); loaded when it exists, else written after the start-up calibration. null = the
    step-cost cache, $MTPX_CACHE_DIR/step_costs (~/.cache/mtpx by default), one file per
    checkpoint and engine setting."""

    _checked_elsewhere = ("method", *SPEC_KEYS)

    @classmethod
    def check(cls, section: str, cfg) -> None:
        check_num_speculative_tokens(cfg.get("num_speculative_tokens"))
        EngineConfig(**spec_engine_keys(cfg))
        super().check(section, cfg)


def spec_engine_keys(cfg) -> dict:
    """The spec section's engine keys (SPEC_KEYS) as plain Python values (lists, not ListConfig)."""
    return {key: OmegaConf.to_container(cfg.get(key)) if OmegaConf.is_config(cfg.get(key)) else cfg.get(key)
            for key in SPEC_KEYS if key in cfg}


# --------------------------------------------------------------------------------------------------
# the modes that generate: eval, bench, distill

QUALITY_GATE_METRICS = ("accuracy", "log_likelihood", "differing_share", "tv_distance")
"""eval.max_quality_loss's metrics (mtpx/evaluate/quality.py)."""


@dataclass
class MaxQualityLoss:
    """eval.max_quality_loss: per quality metric of a lossy rule, the largest loss against the
    lossless rule that passes (null: not gated)."""
    accuracy: Optional[float] = None
    """Task accuracy lost (a fraction: 0.02 = 2 points; needs a prompt set with answers)."""
    log_likelihood: Optional[float] = None
    """The target's mean log-likelihood per output token lost (nats)."""
    differing_share: Optional[float] = None
    """The share of requests whose tokens differ from the lossless rule's."""
    tv_distance: Optional[float] = None
    """The TV-distance estimate above its noise floor (eval.temperature > 0)."""


@dataclass
class GenerationConfig(_Group):
    """What a mode that generates from a prompt set reads (mtpx.evaluate.sampling_params and
    the client's concurrency): the base of the bench, eval and distill groups."""
    num_prompts: Optional[int] = 64
    """Requests: the first this many prompts of the data set (null = the whole data set)."""
    max_tokens: int = 128
    """Output tokens per request at most (data=random: exactly data.output_len)."""
    concurrency: Optional[int] = 64
    """Requests in flight at most (vLLM bench's --max-concurrency; null = no limit, in mode=distill
    the engine's max_num_seqs)."""
    seed: int = 0
    """Request i samples with seed + i (and the seed of the Poisson arrival times)."""
    temperature: float = 0.0
    """0 = greedy; > 0 samples from softmax(logits / temperature)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 or -1 = all)."""
    top_p: float = 1.0
    """Nucleus: keep the smallest set reaching this probability (1 = all)."""
    min_p: float = 0.0
    """Drop tokens below min_p x the top probability (0 = none)."""
    threads: Optional[int] = None
    """Torch threads (null = measured at start-up: the fastest count the CPUs allow;
    OMP_NUM_THREADS wins)."""

    _concurrency_null = "no limit"

    @classmethod
    def check(cls, section: str, cfg) -> None:
        super().check(section, cfg)
        int_or_none(section, cfg, "num_prompts", 1, "the whole data set")
        int_or_none(section, cfg, "concurrency", 1, cls._concurrency_null)
        cls.sampling(section, cfg)

    @staticmethod
    def sampling(section: str, cfg) -> dict:
        """The checked sampling keys: {temperature, top_p, min_p, top_k, max_tokens, seed}."""
        return dict(
            temperature=number(section, cfg, "temperature", lambda v: 0 <= v < math.inf,
                               "a number >= 0 (0 = greedy)"),
            top_p=number(section, cfg, "top_p", lambda v: 0 < v <= 1, "a number in (0, 1] (1 = all tokens)"),
            min_p=number(section, cfg, "min_p", lambda v: 0 <= v <= 1, "a number in [0, 1] (0 = off)"),
            top_k=int_or_none(section, cfg, "top_k", -1),
            max_tokens=int_or_none(section, cfg, "max_tokens", 1),
            seed=int_or_none(section, cfg, "seed", 0))


@dataclass
class ClientConfig(GenerationConfig):
    """The benchmark client of mode=bench (and the base of mode=eval's)."""
    request_rate: float = math.inf
    """Requests per second: inf = all at once, else Poisson arrivals at this mean rate."""
    structured_outputs: Any = None
    """A constraint on the outputs of every structured_outputs_every-th request (0, n, 2n, ...),
    vLLM's StructuredOutputsParams keys: {json: SCHEMA}, {regex: ...}, {choice: [...]},
    {grammar: ...} or {json_object: true}; null = none. metrics.json's structured_outputs and the
    report split acceptance by constrained and unconstrained requests and give the grammar
    masks' host time per step (docs/structured_output.md). The in-process engine only."""
    structured_outputs_every: int = 1
    """With structured_outputs: constrain requests 0, n, 2n, ... (1 = all; 2 = every other one)."""

    @classmethod
    def check(cls, section: str, cfg) -> None:
        cls.client(section, cfg)
        super().check(section, cfg)

    @staticmethod
    def client(section: str, cfg) -> dict:
        """The checked client keys: {request_rate, seed, concurrency}."""
        raw = cfg.get("request_rate")
        try:
            rate = float(raw)
        except (TypeError, ValueError):
            rate = math.nan
        if isinstance(raw, bool) or not rate > 0:
            raise ValueError(f"{section}.request_rate={raw!r}: must be a number of requests per second "
                             "> 0, or inf (all requests at once)")
        return dict(request_rate=rate, seed=int_or_none(section, cfg, "seed", 0),
                    concurrency=int_or_none(section, cfg, "concurrency", 1, "no limit"))


@dataclass
class BenchConfig(ClientConfig):
    """mode=bench: the serving benchmark client (vLLM `bench serve`'s knobs)."""
    base_url: Optional[str] = None
    """An OpenAI-compatible server (http://host:port/v1: mode=serve, vllm serve, SGLang); null =
    the engine in process."""
    model_name: Optional[str] = None
    """The model id sent with base_url (null = the first one the server lists)."""


@dataclass
class EvalConfig(ClientConfig):
    """mode=eval: the benchmark client and the checks."""
    check_lossless: Optional[bool] = None
    """Also decode without speculation; exit non-zero if tokens differ (greedy only). null (the
    default): true with the lossless rule; a lossy spec.acceptance runs its lossless reference for
    the quality metrics instead (and refuses true)."""
    max_quality_loss: MaxQualityLoss = field(default_factory=lambda: MaxQualityLoss())
    """With a lossy spec.acceptance: the largest loss allowed per quality metric
    (eval.max_quality_loss.accuracy=0.02, ...; docs/acceptance_rules.md); a run that exceeds one
    exits 1 with one line."""
    tv_num_prompts: int = 4
    """With a lossy spec.acceptance at temperature > 0: prompts (the first ones) of the TV-distance
    estimate (0 = none)."""
    tv_num_samples: int = 32
    """Samples per prompt and side of the TV-distance estimate."""
    tv_max_tokens: int = 8
    """Output tokens per sample of the TV-distance estimate (the positions it averages over)."""
    speed_repeats: int = 1
    """With a lossy spec.acceptance: timed passes of each side (the rule and its lossless reference,
    alternating which runs first); the speed-up is the ratio of their mean tok/s."""
    reference_cache: Optional[str] = None
    """With a lossy spec.acceptance: a folder where the lossless reference's quality data is stored
    and reused, keyed by a hash of all that determines it (null: in a multirun the sweep folder's
    lossless_references/, else none; docs/acceptance_rules.md)."""

    @classmethod
    def check(cls, section: str, cfg) -> None:
        int_or_none(section, cfg, "tv_num_prompts", 0)
        int_or_none(section, cfg, "tv_num_samples", 1)
        int_or_none(section, cfg, "tv_max_tokens", 1)
        int_or_none(section, cfg, "speed_repeats", 1)
        for key, bound in (cfg.get("max_quality_loss") or {}).items():
            if key not in QUALITY_GATE_METRICS:
                raise ValueError(f"{section}.max_quality_loss.{key}: unknown metric: choose one of "
                                 f"{', '.join(QUALITY_GATE_METRICS)}")
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                                      or not bound >= 0):
                raise ValueError(f"{section}.max_quality_loss.{key}={bound!r}: must be a number >= 0 or null")
        super().check(section, cfg)
    tie_tolerance: float = 1.0e-4
    """A divergence where the plain run's top-2 logit gap is below this is a near-tie."""
    resume: bool = False
    """true: keep the requests that finished in this run folder's outputs.jsonl
    (hydra.run.dir=the interrupted run's folder) and generate only the others."""


@dataclass
class DistillConfig(GenerationConfig):
    """mode=distill: the target regenerates the answers of the data group's prompt set."""
    out_dir: str = "distill/run"
    """The folder of manifest.json + shards; rerunning the same command resumes."""
    shard_size: int = 256
    """Prompts per shard file (written atomically once all its prompts finished)."""
    stop: Optional[list[str]] = None
    """Stop strings, e.g. '["Question:"]' (null = none; eos always stops)."""

    _concurrency_null = "the engine's max_num_seqs"

    @classmethod
    def check(cls, section: str, cfg) -> None:
        int_or_none(section, cfg, "shard_size", 1)
        super().check(section, cfg)


@dataclass
class ServeConfig(_Group):
    """mode=serve: the OpenAI-compatible HTTP server (mtpx/serve/)."""
    host: str = "127.0.0.1"
    """The address to listen on (0.0.0.0: every interface)."""
    port: int = 8000
    """The TCP port."""
    model_name: Optional[str] = None
    """The id clients send as "model" (null = the checkpoint folder's name)."""
    threads: Optional[int] = None
    """Torch threads (null = measured at start-up; OMP_NUM_THREADS wins)."""
    max_body_bytes: int = 33554432
    """A request body over this many bytes gets a 413 (32 MiB)."""
    shutdown_timeout: float = 10.0
    """SIGTERM / Ctrl-C: in-flight requests get this many seconds to finish, then are aborted;
    the server exits 0 (vLLM's --shutdown-timeout)."""
    latency_buckets: Optional[list[float]] = None
    """TTFT/TPOT/ITL/E2EL histogram bounds in seconds (null = 0.5 ms .. about 17 min, 19% apart)."""
    api_key: Optional[str] = None
    """Clients must send `Authorization: Bearer <key>` to every route but /health and /metrics, else
    401 (vLLM's --api-key); null = the environment variable MTPX_API_KEY, unset = no key."""
