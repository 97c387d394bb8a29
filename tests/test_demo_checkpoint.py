"""The committed demo checkpoint: loads, drafts well, and is lossless (float64) for mtp1 and mtp8."""
import pytest

from mtpx import LLM, SamplingParams
from mtpx.data.gsm8k import format_prompt
from mtpx.data.prompts import builtin_prompts
from mtpx.engine.llm import DEFAULT_MODEL

PROMPTS = [format_prompt("Tom has 3 boxes with 12 apples each. He eats 5 apples. How many are left?"),
           format_prompt("A train travels 60 miles per hour for 2.5 hours. How far does it go?")] + \
          [p.text for p in builtin_prompts(3)]


@pytest.fixture(scope="module")
def plain():
    llm = LLM(model=DEFAULT_MODEL, dtype="float64")
    return llm, [o.output_token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=40))]


@pytest.mark.parametrize("spec,k", [("mtp1", 1), ("mtp1", 3), ("mtp8", 8)])
def test_demo_lossless(plain, spec, k):
    base, expected = plain
    llm = LLM(model=base.model, tokenizer=base.tokenizer, spec=spec, num_speculative_tokens=k)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=40))
    assert [o.output_token_ids for o in outs] == expected
    drafted = sum(o.spec.num_draft_tokens for o in outs)
    accepted = sum(o.spec.num_accepted_tokens for o in outs)
    assert accepted > 0.2 * drafted, f"the demo's drafts should often be accepted ({accepted}/{drafted})"


def test_demo_config_has_eight_modules():
    llm = LLM(model=DEFAULT_MODEL)
    assert llm.model.cfg.num_nextn_predict_layers == 8
    assert sum(p.numel() for p in llm.model.parameters()) * 4 < 40e6


@pytest.mark.slow
@pytest.mark.parametrize("spec,k", [("mtp1", 1), ("mtp8", 8)])
def test_demo_lossless_on_gsm8k_float64(spec, k):
    """64 real GSM8K test prompts, 128 tokens, float64: spec output equals plain output exactly."""
    from pathlib import Path

    from mtpx.data.gsm8k import load_gsm8k
    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    prompts = [format_prompt(r["question"]) for r in load_gsm8k(path)[:64]]
    base = LLM(model=DEFAULT_MODEL, dtype="float64")
    plain = base.generate(prompts, SamplingParams(max_tokens=128))
    llm = LLM(model=base.model, tokenizer=base.tokenizer, spec=spec, num_speculative_tokens=k)
    outs = llm.generate(prompts, SamplingParams(max_tokens=128))
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in plain]
