"""The groups' structured configs (mtpx/schema/groups.py): a default and a docstring per field,
Literal choices checked with one line, every range check in the group's `check`, and YAML files
in conf/ that only override."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import MISSING, OmegaConf

from mtpx import schema
from mtpx.models.config import ModelConfig
from mtpx.schema import groups
from mtpx.schema.train_group import TrainConfig

CONF = str(Path(__file__).resolve().parents[1] / "conf")
CHECKED = ("spec", "eval", "bench", "serve", "distill", "train")


def _cfg(overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=overrides)


def _docstrings(cls) -> set[str]:
    import sys
    sys.path.insert(0, str(Path(CONF).parent / "tools"))
    import gen_config_docs
    return set(gen_config_docs.field_docs(cls)[0])


@pytest.mark.parametrize("group", CHECKED)
def test_every_field_has_a_docstring_and_a_default_unless_an_option_must_set_it(group):
    for cls in schema.SCHEMAS[group].values():
        fields = dataclasses.fields(cls)
        assert {f.name for f in fields} == _docstrings(cls), cls
        unset = [f.name for f in fields if f.default == MISSING]      # omegaconf's "???": the option sets it
        assert unset == (["method", "num_speculative_tokens"] if group == "spec" else []), cls


def _defaults(cls) -> dict:
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in dataclasses.fields(cls)}


# a key the demo model group sets to ModelConfig's own default on purpose: null would mean the
# checkpoint's count with model.path in mode=train (mtpx.train.setup.init_from), 8 trains 8
DEMO_KEPT = {"num_nextn_predict_layers"}


@pytest.mark.parametrize("group", sorted(schema.SCHEMAS))
def test_yaml_files_only_override_the_schema_defaults(group):
    """A key in conf/GROUP/*.yaml sets a value other than its schema's default (the demo model
    group's null keys mean ModelConfig's defaults: a key equal to one of those is a copy too)."""
    model_defaults = _defaults(ModelConfig)
    for path in sorted((Path(CONF) / group).glob("*.yaml")):
        raw = OmegaConf.to_container(OmegaConf.load(path))
        cls = schema.SCHEMAS[group][next(d for d in raw.pop("defaults") if schema.is_schema(d))]
        defaults = _defaults(cls)
        if cls is schema.DemoModel:
            defaults.update({k: v for k, v in model_defaults.items() if k not in DEMO_KEPT})
        assert [k for k, v in raw.items() if defaults[k] == v] == [], path


def test_the_root_config_only_overrides_run_config():
    raw = OmegaConf.to_container(OmegaConf.load(Path(CONF) / "config.yaml"), resolve=False)
    defaults = _defaults(groups.RunConfig)
    assert [k for k, v in raw.items() if k in defaults and defaults[k] == v] == []


def test_composed_defaults_are_the_schemas():
    cfg = _cfg(["+spec=mtp8"])
    assert OmegaConf.to_container(cfg.eval) == {
        f.name: (f.default if f.default_factory is dataclasses.MISSING
                 else dataclasses.asdict(f.default_factory()))
        for f in dataclasses.fields(groups.EvalConfig)}      # eval.max_quality_loss: a group of keys
    assert cfg.bench.concurrency == 16 and cfg.bench.request_rate == float("inf")
    assert cfg.distill.concurrency is None and cfg.distill.max_tokens == 256 and cfg.distill.top_k == -1
    assert cfg.spec.verify == "standard" and _cfg(["+spec=mtp8_block"]).spec.verify == "block"
    assert cfg.train.data_sources == ["gsm8k", "stdlib"]
    assert cfg.train.gsm8k_path.endswith("/gsm8k/train.jsonl")


def test_literal_choices_are_checked_with_one_line():
    assert groups.literal_choices(TrainConfig) == {"save_dtype": ("float32", "bfloat16", "float16"),
                                                          "parallel": ("auto", "none", "ddp", "fsdp"),
                                                          "autocast": ("bfloat16", None),
                                                          "mtp_loss": ("ce", "kl", "tv", "lk_hybrid",
                                                                       "lk_nll"),
                                                          "mtp_hidden_input": ("chain", "target")}
    # OmegaConf has no Literal: the ConfigStore's node takes a string, the check the choices
    assert _cfg(["+spec=mtp8", "spec.verify=foo"]).spec.verify == "foo"
    with pytest.raises(ValueError, match=r"^spec.verify='foo': choose one of standard, block$"):
        schema.check("spec", _cfg(["+spec=mtp8", "spec.verify=foo"]).spec)
    with pytest.raises(ValueError, match=r"^train.parallel='zero3': use one of auto, none, ddp, fsdp$"):
        schema.check("train", _cfg(["train.parallel=zero3"]).train)
    schema.check("train", _cfg(["train.autocast=bfloat16"]).train)


@pytest.mark.parametrize("section,override,message", [
    ("eval", "eval.request_rate=0",
     "eval.request_rate=0.0: must be a number of requests per second > 0, or inf (all requests at once)"),
    ("bench", "bench.concurrency=0", "bench.concurrency=0: must be an integer >= 1, or null (no limit)"),
    ("eval", "eval.num_prompts=0",
     "eval.num_prompts=0: must be an integer >= 1, or null (the whole data set)"),
    ("eval", "eval.top_p=0", "eval.top_p=0.0: must be a number in (0, 1] (1 = all tokens)"),
    ("distill", "distill.concurrency=0",
     "distill.concurrency=0: must be an integer >= 1, or null (the engine's max_num_seqs)"),
    ("distill", "distill.shard_size=0", "distill.shard_size=0: must be an integer >= 1"),
    ("train", "train.min_lr=1.0", "train.min_lr=1.0: must be a number in [0, train.lr=0.003]"),
    ("spec", "spec.num_speculative_tokens=-1",
     "spec.num_speculative_tokens=-1: give an integer >= 0, null or auto"),
])
def test_each_groups_checks_are_in_its_dataclass(section, override, message):
    cfg = _cfg(["+spec=mtp8", override])
    with pytest.raises(ValueError) as e:
        schema.check(section, cfg[section])
    assert str(e.value) == message


def test_the_shipped_options_pass_their_checks():
    cfg = _cfg(["+spec=mtp8"])
    for section in CHECKED:
        schema.check(section, cfg[section])
