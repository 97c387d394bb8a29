"""Every config class: a docstring per field, a Literal for every fixed choice, and each value
checked in one place (issue 67, item 4)."""
from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

import pytest

from mtpx import LLM, schema
from mtpx.auto_k.config import AutoKConfig
from mtpx.cli import check_overrides
from mtpx.engine.config import EngineConfig
from mtpx.models.config import ModelConfig, literal_choices
from mtpx.schema import groups
from mtpx.spec_decode import SPECULATORS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gen_config_docs  # noqa: E402

CONFIG_CLASSES = sorted({EngineConfig, ModelConfig, AutoKConfig, groups.RunConfig, groups.DemoLoading,
                         *(cls for options in schema.SCHEMAS.values() for cls in options.values()
                           if cls is not schema.DemoModel)}, key=lambda c: c.__name__)

# str fields whose values are open: paths, names, addresses, torch's own names
FREE_TEXT = {
    "data_dir", "path", "draft_path", "cost_model_file", "out_dir", "gsm8k_path", "fewshot_path",
    "distill_path", "hidden_states_path", "dir", "host", "base_url", "model_name", "project", "api_key",
    "name",              # the data set's or logger's name, fixed by the group option that sets it
    "device",            # any torch device of type cpu or cuda (cuda:1), checked by mtpx.train.setup
    "compile_backend",   # any torch._dynamo backend, checked against its registry by EngineConfig
    "stop", "categories", "data_sources",     # lists of stop strings, categories, source:weight
    "reference_cache",   # a folder for stored lossless references (mtpx.evaluate.reference)
}


def _has_bare_str(tp) -> bool:
    """tp is str, or holds str outside a Literal (Optional[str], list[str], ...)."""
    if tp is str:
        return True
    if typing.get_origin(tp) is typing.Literal:
        return False
    return any(_has_bare_str(a) for a in typing.get_args(tp))


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_every_config_field_has_a_docstring(cls):
    docs, _ = gen_config_docs.field_docs(cls)
    assert [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)] == []


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_every_fixed_choice_is_a_literal(cls):
    """A str field is free text (FREE_TEXT, with its reason) or a Literal of its choices."""
    hints = typing.get_type_hints(cls)
    bare = [f.name for f in dataclasses.fields(cls)
            if _has_bare_str(hints[f.name]) and f.name not in FREE_TEXT]
    assert bare == [], f"{cls.__name__}: type these Literal[...] (or add a free-text field to FREE_TEXT)"


def test_the_introspection_sees_a_bare_str_choice():
    @dataclasses.dataclass
    class Added:
        kernel: str = "triton"
        """triton | cuda."""
    assert _has_bare_str(typing.get_type_hints(Added)["kernel"])
    assert not _has_bare_str(typing.get_type_hints(EngineConfig)["verify"])
    assert not _has_bare_str(typing.Optional[typing.Literal["bfloat16"]])


def test_choices_agree_with_the_code_that_reads_them():
    from mtpx.attention.backend import ATTENTION_BACKENDS
    from mtpx.engine.llm import DTYPES
    from mtpx.hf.config import FAMILIES
    from mtpx.models.gated_delta_rule import GDN_BACKENDS
    engine = literal_choices(EngineConfig)
    assert engine["attention_backend"] == ATTENTION_BACKENDS and engine["gdn_backend"] == GDN_BACKENDS
    assert literal_choices(groups.SpecConfig)["method"] == tuple(sorted(SPECULATORS))
    assert set(literal_choices(groups.HFModel)["dtype"]) == set(DTYPES)
    assert literal_choices(groups.DemoLoading)["dtype"] == literal_choices(groups.HFModel)["dtype"]
    assert set(literal_choices(ModelConfig)["model_type"]) == set(FAMILIES)
    assert literal_choices(groups.SpecConfig)["verify"] == engine["verify"]
    assert literal_choices(groups.SpecConfig)["draft_sample_method"] == engine["draft_sample_method"]


@pytest.mark.parametrize("cls,kwargs,line", [
    (EngineConfig, {"gdn_backend": "bogus"}, "engine.gdn_backend='bogus': choose one of auto, torch, fla"),
    (EngineConfig, {"attention_backend": "xformers"},
     "engine.attention_backend='xformers': choose one of torch, flashinfer"),
    (EngineConfig, {"verify": "fast"}, "spec.verify='fast': choose one of standard, block"),
    (ModelConfig, {"mtp_style": "eagle"},
     "model config mtp_style='eagle': choose one of qwen3_next, deepseek_v3"),
    (ModelConfig, {"hidden_act": "gelu"}, "model config hidden_act='gelu': choose one of silu"),
    (ModelConfig, {"model_type": "gpt2"},
     "model config model_type='gpt2': choose one of qwen3_next, qwen3, llama"),
    (ModelConfig, {"layer_types": ["linear_attention"] * 3 + ["sliding"]},
     "model config layer_types[3]='sliding': choose one of linear_attention, full_attention"),
])
def test_a_bad_choice_is_one_line_naming_the_key(cls, kwargs, line):
    with pytest.raises(ValueError) as e:
        cls(**kwargs)
    assert str(e.value) == line


BAD_K = [("2.5", 2.5), ("abc", "abc"), ("-1", -1), ("true", True)]


@pytest.mark.parametrize("text,value", BAD_K)
def test_a_bad_num_speculative_tokens_is_one_line_from_one_check(text, value):
    """The command line and LLM(speculative_config=...) (and LLM(num_speculative_tokens=...)) get
    the same line, raised by check_num_speculative_tokens (the one check of this value)."""
    line = f"spec.num_speculative_tokens={value!r}: give an integer >= 0, null or auto"
    assert check_overrides(["+spec=mtp8", f"spec.num_speculative_tokens={text}"], ROOT / "conf") == line
    for kwargs in ({"speculative_config": {"method": "mtp8", "num_speculative_tokens": value}},
                   {"spec": "mtp8", "num_speculative_tokens": value}):
        with pytest.raises(ValueError) as e:
            LLM(model=ROOT / "no-such-checkpoint", **kwargs)       # refused before anything loads
        assert str(e.value) == line
        assert e.traceback[-1].name == "check_num_speculative_tokens"
    with pytest.raises(ValueError) as e:
        schema.check("spec", {"method": "mtp8", "num_speculative_tokens": value})
    assert str(e.value) == line and e.traceback[-1].name == "check_num_speculative_tokens"


@pytest.mark.parametrize("value", [None, 0, 3, "auto"])
def test_good_num_speculative_tokens_pass_the_check(value):
    schema.check("spec", {"method": "mtp8", "num_speculative_tokens": value})
