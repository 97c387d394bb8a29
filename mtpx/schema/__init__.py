"""Structured configs (Hydra's ConfigStore) for `train_or_eval.py`: the type and the key names of
every config group, checked when Hydra composes the run config, so a typo (`eval.num_promts=8`,
`+spce=mtp8`) or a wrong type (`spec.num_speculative_tokens=2.5`) stops the run before it starts.

Each group's dataclass (mtpx/schema/groups.py and, for train, train_group.py; the engine group:
mtpx.engine.config.EngineConfig) gives every key its type, default and docstring, and holds the
group's checks (`check(section, cfg)`: ranges and Literal choices, one line naming the key); the
YAML files of `conf/` pull their schema in through their defaults list (`- <group>_schema`) and
only override.

`compose_error(argv, conf_dir)` composes the config the way `train_or_eval.py` will and turns
Hydra's and OmegaConf's multi-line errors into one line naming the key and the closest valid one.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import os
from dataclasses import field
from pathlib import Path
import types
import typing
from typing import Any, Literal, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from mtpx.engine.config import SPEC_KEYS, EngineConfig
from mtpx.models.config import ModelConfig

from mtpx.schema.groups import (  # noqa: F401 - the schemas, importable from mtpx.schema
    BenchConfig, BuiltinData, ChatData, ClientConfig, DemoLoading, DistillConfig, EvalConfig, FileData,
    GenerationConfig, GSM8KData, HFModel, NoLogger, RandomData, RunConfig, ServeConfig, SpecConfig,
    WandbLogger, check_group)
from mtpx.schema.train_group import TrainConfig  # noqa: F401


def _optional(tp: Any) -> Any:
    """A ModelConfig annotation as OmegaConf takes it, nullable (Any for a dict or a union of
    several types)."""
    kinds = [a for a in typing.get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
    if len(kinds) > 1 or kinds[0] is dict or typing.get_origin(kinds[0]) is dict or kinds[0] is Any:
        return Any
    return Optional[kinds[0]]


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _demo_model_schema() -> type:
    """The demo model group: the loading keys path, dtype and allow_pickle (DemoLoading), then every
    ModelConfig field, null meaning ModelConfig's default (a fresh model of any shape for
    mode=train; `mtpx.train.loop` drops the nulls)."""
    hints = typing.get_type_hints(ModelConfig)
    fields = [(f.name, _optional(hints[f.name]), field(default=None))
              for f in dataclasses.fields(ModelConfig)]
    return dataclasses.make_dataclass("DemoModel", fields, bases=(DemoLoading,),
                                      namespace={"__module__": __name__})


DemoModel = _demo_model_schema()


def _engine_schema() -> type:
    """EngineConfig without the keys the spec group owns (SPEC_KEYS: verify, draft_sample_method)."""
    hints = typing.get_type_hints(EngineConfig)
    kept = [(f.name, hints[f.name], field(default=f.default)) for f in dataclasses.fields(EngineConfig)
            if f.name not in SPEC_KEYS]
    return dataclasses.make_dataclass("EngineGroup", kept, namespace={"__module__": __name__})


EngineGroup = _engine_schema()


SCHEMAS: dict[str, dict[str, type]] = {
    "spec": {"spec_schema": SpecConfig},
    "eval": {"eval_schema": EvalConfig},
    "bench": {"bench_schema": BenchConfig},
    "serve": {"serve_schema": ServeConfig},
    "distill": {"distill_schema": DistillConfig},
    "train": {"train_schema": TrainConfig},
    "data": {"builtin_schema": BuiltinData, "file_schema": FileData, "gsm8k_schema": GSM8KData,
             "chat_schema": ChatData, "random_schema": RandomData},
    "model": {"demo_schema": DemoModel, "hf_schema": HFModel},
    "logger": {"none_schema": NoLogger, "wandb_schema": WandbLogger},
}


_NODES: dict[type, type] = {}


def omegaconf_node(cls: type) -> type:
    """`cls` as OmegaConf takes it: the same fields and defaults, with `str` in place of each
    Literal annotation (OmegaConf has none; the group's `check`, or the code that reads the key,
    tests the choices). Cached per class."""
    if cls not in _NODES:
        hints = typing.get_type_hints(cls)
        plain = {name: _plain(tp) for name, tp in hints.items()}
        if plain == hints:
            _NODES[cls] = cls
        else:
            fields = [(f.name, plain[f.name], field(default=f.default, default_factory=f.default_factory))
                      for f in dataclasses.fields(cls)]
            _NODES[cls] = dataclasses.make_dataclass(cls.__name__, fields, namespace={"__module__": __name__})
    return _NODES[cls]


def _plain(tp: Any) -> Any:
    """tp with str for every Literal in it (Optional[Literal[...]], list[Literal[...]], ...)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is Literal:
        return str
    if typing.get_origin(tp) is list:
        return list[_plain(args[0])]
    if _is_union(tp):
        return typing.Union[tuple(_plain(a) for a in args)]
    return tp


def check(section: str, cfg, option: str | None = None) -> None:
    """The checks of the `section` group (mtpx/schema/groups.py) on its composed node `cfg`:
    ValueError with one line naming SECTION.KEY. option: the group option whose schema applies
    (None: the group's first)."""
    options = SCHEMAS[section]
    cls = options[option] if option is not None else next(iter(options.values()))
    check_group(section, cls, cfg)


def register() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent). The engine group's one option,
    `default`, is the schema itself. Also registers the `${run_id:}` resolver of the run folder
    names (conf/config.yaml): this process's id."""
    cs = ConfigStore.instance()
    OmegaConf.register_new_resolver("run_id", lambda: str(os.getpid()), use_cache=True, replace=True)
    OmegaConf.register_new_resolver("config_groups", lambda: config_groups_text(CONF_DIR), replace=True)
    cs.store(name="run_schema", node=omegaconf_node(RunConfig))
    for group, options in SCHEMAS.items():
        for name, node in options.items():
            cs.store(group=group, name=name, node=omegaconf_node(node))
    cs.store(group="engine", name="default", node=omegaconf_node(EngineGroup))


register()  # on import, as Hydra's ConfigStore is meant to be filled (train_or_eval.py, tests)


def is_schema(name: str) -> bool:
    """Group options that are schemas, not choices a user picks."""
    return name.endswith("_schema")


def data_dir(conf_dir: Path) -> Path:
    """The data directory (the run config's `data_dir`: MTPX_DATA_DIR when set, else the default
    in `conf_dir`/config.yaml) as an absolute path; a relative one is taken from `conf_dir`'s
    parent, the repository root that runs start in. Tools and tests find the public data sets
    (GSM8K, Spec-Bench, MT-Bench, HumanEval) here."""
    conf_dir = Path(conf_dir).resolve()
    path = Path(OmegaConf.load(conf_dir / "config.yaml").data_dir)
    return path if path.is_absolute() else (conf_dir.parent / path).resolve()


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"   # train_or_eval.py's config folder


def config_groups_text(conf_dir: Path) -> str:
    """`--help`'s list of config groups, one line each ("data: builtin, gsm8k, ..."), without the
    schema entries (conf/config.yaml's hydra.help.template reads it as `${config_groups:}`)."""
    groups = sorted({p.name for p in conf_dir.iterdir() if p.is_dir()} | {"engine"})
    return "\n".join(f"{'+' if g == 'spec' else ''}{g}: {', '.join(group_choices(g, conf_dir))}"
                     for g in groups)


def group_choices(group: str, conf_dir: Path) -> list[str]:
    """The options a user can pick for `group`: its YAML files and its ConfigStore entries."""
    names = {p.stem for p in (conf_dir / group).glob("*.yaml")}
    if group == "engine":
        names.add("default")
    return sorted(n for n in names if not is_schema(n))


# --------------------------------------------------------------------------------------------------
# composing ahead of Hydra's main, for one-line errors


def compose_error(argv: list[str], conf_dir: Path) -> str | None:
    """Compose the run config from command-line overrides as `train_or_eval.py` will; None when it
    composes, else one error line naming the key (and the closest valid one). A sweep
    (`a=1,2`, `-m`) is checked one value at a time. Hydra's own options (`-m`, `--cfg job`,
    `hydra.*`) are left to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if any(a in ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "--info", "-i",
                 "--help", "-h", "--hydra-help") or a.startswith(("--config-name=", "--config-path=",
                                                                    "--config-dir="))
           for a in argv):
        return None
    args = [a for i, a in enumerate(argv)
            if not a.startswith("-") and not a.lstrip("+~").startswith("hydra")
            and not (i > 0 and argv[i - 1] in ("-c", "--cfg", "-p", "--package"))]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except Exception as e:  # noqa: BLE001 - Hydra's parse errors: keep their first line
        return _first_line(e)
    if (twice := duplicate_key(parsed)) is not None:
        return twice
    first = [_first_value(o) for o in parsed]
    variants = [first]
    for i, o in enumerate(parsed):
        if o.is_sweep_override():
            variants += [first[:i] + [v] + first[i + 1:] for v in _sweep_values(o)[1:]]
    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
            for overrides in variants:
                try:
                    cfg = compose("config", overrides=overrides)
                except Exception as e:  # noqa: BLE001 - every composition error becomes one line
                    return explain(e, overrides)
                extra = extra_key(cfg) or spec_error(cfg)
                if extra is not None:
                    return extra
    finally:
        GlobalHydra.instance().clear()
    return None


def spec_error(cfg) -> str | None:
    """The spec group's checks (SpecConfig.check) on the composed config: its one line, or None
    (also None without +spec)."""
    spec = cfg.get("spec")
    if spec is None:
        return None
    try:
        check("spec", spec)
    except ValueError as e:
        return str(e)
    return None


def extra_key(cfg) -> str | None:
    """The first key that `+key=value` added outside its node's schema (Hydra appends under
    `open_dict`, past the struct flag), as unknown_key's line; None when there is none."""
    from omegaconf import DictConfig, OmegaConf

    def walk(node, prefix: str):
        obj = OmegaConf.get_type(node)
        if dataclasses.is_dataclass(obj):
            known = {f.name for f in dataclasses.fields(obj)}
            for key in node.keys():
                if key not in known and not (prefix == "" and key == "hydra"):
                    return unknown_key(f"{prefix}{key}", obj)
        for key in node.keys():
            if (key != "hydra" and isinstance(node._get_node(key), DictConfig)
                    and not OmegaConf.is_missing(node, key)):
                found = walk(node[key], f"{prefix}{key}.")
                if found:
                    return found
        return None

    return walk(cfg, "")


def _first_value(o) -> str:
    return o.input_line if not o.is_sweep_override() else _sweep_values(o)[0]


def _sweep_values(o) -> list[str]:
    """`key=a,b` -> ['key=a', 'key=b'] (with the override's + or ~ prefix)."""
    prefix = {"append": "+", "delete": "~"}.get(getattr(o.type, "name", "").lower(), "")
    if getattr(o.type, "name", "") == "FORCE_ADD":
        prefix = "++"
    key = o.get_key_element()
    return [f"{prefix}{key}={v}" for v in o.sweep_string_iterator()]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None:
        e = e.__cause__
    return e


def explain(e: BaseException, overrides: list[str]) -> str:
    """One line for a composition error `e` (the cause's full key, what is wrong, the fix)."""
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    cause = _root_cause(e)
    if isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or ""
        obj = getattr(cause, "object_type", None)
        if isinstance(cause, ConfigKeyError) or "not in struct" in str(cause) or "not in '" in str(cause):
            return unknown_key(key, obj)
        if isinstance(cause, ValidationError) and key:
            msg = getattr(cause, "msg", str(cause)).splitlines()[0]
            named = re.match(r"Value '(.*?)'", msg)     # the value that failed (a key given twice: either)
            value = named.group(1) if named else _override_value(key, overrides)
            want = _type_word(msg)
            return f"{key}={value}: {want}" if want else f"{key}={value}: {msg}"
    text = _first_line(cause if isinstance(cause, OmegaConfBaseException) else e)
    for o in overrides:  # "Could not append to config. An item is already at 'x'" and the like
        key = o.lstrip("+~").split("=", 1)[0]
        if f"'{key}'" in str(e) and "already" in str(e):
            return f"'{o}': {key} is already set; override it with '{o.lstrip('+')}'"
    return text


def unknown_key(full_key: str, obj: type | None) -> str:
    """'unknown key eval.num_promts: did you mean eval.num_prompts?' (closest field of the node)."""
    section, _, name = full_key.rpartition(".")
    if obj is not None and dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj)]
    else:
        names = [f.name for f in dataclasses.fields(RunConfig)]
    elsewhere = _sections_with(name, section)
    if elsewhere:                  # the right name in the wrong place: eval.device, tensor_parallel_size
        cpu = " (eval, bench and serve decode on the CPU)" if name == "device" else ""
        return f"unknown key '{full_key}': did you mean {' or '.join(f'{s}.{name}' for s in elsewhere)}?{cpu}"
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    where = f"{section}." if section else ""
    if close:
        hint = close[0]
        if not section and hint == "spec":
            return f"unknown key '{full_key}': did you mean +spec=NAME (the speculator group)?"
        return f"unknown key '{full_key}': did you mean {where}{hint}?"
    choices = ", ".join(sorted(names))
    which = f"the {section} keys are" if section else "choose one of"
    return f"unknown key '{full_key}': {which} {choices}"


def _sections_with(name: str, section: str) -> list[str]:
    """The config groups other than `section` that have a key `name` (the engine group first)."""
    nodes = [("engine", EngineGroup)] + [(g, c) for g, options in SCHEMAS.items() for c in options.values()]
    found = [g for g, cls in nodes if g != section and name in {f.name for f in dataclasses.fields(cls)}]
    return list(dict.fromkeys(found))


def duplicate_key(overrides) -> str | None:
    """One line when a command line chooses a config group twice (`+spec=mtp8 +spec=mtp1`,
    `model=hf model=demo`), which Hydra refuses with "Multiple values for spec. To override a
    value use 'override spec: mtp1'". A value key given twice is legal (the last one wins)."""
    seen: dict[str, str] = {}
    for o in overrides:
        key = o.key_or_group
        if key not in SCHEMAS and key not in ("engine",):
            continue
        if key in seen:
            return f"{key} is given twice ({seen[key]} and {o.input_line}): give it once"
        seen[key] = o.input_line
    return None


def _override_value(full_key: str, overrides: list[str]) -> str:
    """The value the failing override gave: the last one for a key given twice (Hydra applies
    overrides in order, so the last is the one checked)."""
    for o in reversed(overrides):
        key, _, value = o.lstrip("+~").partition("=")
        if key == full_key:
            return value
    return "?"


def _type_word(msg: str) -> str | None:
    """What OmegaConf's conversion message asks for, in a few words."""
    for pattern, word in (("to Integer", "must be an integer"), ("to Float", "must be a number"),
                          ("to Boolean", "must be true or false"), ("valid bool", "must be true or false"),
                          ("to String", "must be a string"), ("is not Optional", "must not be null"),
                          ("not a ListConfig", "must be a list, e.g. [a,b]")):
        if pattern in msg:
            return word
    return None
