"""GSM8K loading, answer extraction and scoring; built-in prompts; the prompt-set dispatcher."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mtpx.data import (
    STDLIB_HELDOUT_MODULES,
    Prompt,
    builtin_prompts,
    extract_predicted_answer,
    extract_reference_answer,
    format_example,
    format_prompt,
    load_gsm8k,
    load_prompts,
    score,
)

GSM8K_TEST = Path(__file__).resolve().parents[1] / "shared" / "data" / "gsm8k" / "test.jsonl"
if not GSM8K_TEST.is_file():  # the checkout may sit next to shared/ instead of containing it
    GSM8K_TEST = Path("/work/shared/data/gsm8k/test.jsonl")
needs_gsm8k = pytest.mark.skipif(not GSM8K_TEST.is_file(), reason="shared/data/gsm8k is absent")


def test_prompt_format():
    assert format_prompt("How many?") == "Question: How many?\nAnswer:"
    assert format_example("How many?", "2+2=4\n#### 4") == "Question: How many?\nAnswer: 2+2=4\n#### 4"


@needs_gsm8k
def test_load_real_gsm8k_test_split():
    rows = load_gsm8k(GSM8K_TEST)
    assert len(rows) == 1319
    assert rows[0]["question"].startswith("Janet")
    assert extract_reference_answer(rows[0]["answer"]) == "18"
    assert all(extract_reference_answer(r["answer"]).lstrip("-").isdigit() for r in rows)
    # the references score themselves perfectly
    assert score([r["answer"] for r in rows], [r["answer"] for r in rows]) == (1.0, 1319)


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "g.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"question": "q", "answer": "a\n#### 1,000"})


def test_load_gsm8k_skips_blank_lines(tmp_path):
    rows = load_gsm8k(_write(tmp_path, [GOOD, "", GOOD]))
    assert rows == [{"question": "q", "answer": "a\n#### 1,000"}] * 2


@pytest.mark.parametrize(
    "bad_line, lineno, message",
    [
        ('{"question": "q", "answer": ', 2, "malformed JSON"),
        ('["q", "a"]', 2, "expected a JSON object, got list"),
        ('{"question": "q"}', 2, "key 'answer' is missing"),
        ('{"question": 3, "answer": "a"}', 2, "key 'question' is not a string"),
    ],
)
def test_load_gsm8k_errors_name_file_and_line(tmp_path, bad_line, lineno, message):
    path = _write(tmp_path, [GOOD, bad_line, GOOD])
    with pytest.raises(ValueError) as err:
        load_gsm8k(path)
    assert f"{path}:{lineno}: " in str(err.value)
    assert message in str(err.value)


def test_load_gsm8k_missing_file_names_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data\.path="):
        load_gsm8k(tmp_path / "nope.jsonl")


def test_extract_reference_answer():
    assert extract_reference_answer("so 3 * 4 = 12\n#### 1,234 ") == "1234"
    with pytest.raises(ValueError, match="####"):
        extract_reference_answer("no final line")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She makes 9 * 2 = $18.\n#### 18", "18"),
        ("#### $1,000.", "1000"),
        ("#### 5.0\nQuestion: then 7", "5"),
        ("first #### 3 then #### 4", "3"),
        ("The answer is 12, not 1,000 or 5.50", "5.5"),
        ("It is -3", "-3"),
        ("So 42.\nQuestion: Tom has 7 apples", "42"),  # the invented next question is ignored
        ("#### none, so 8", "8"),  # no number after ####: fall back to the last number
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract_predicted_answer(text, expected):
    assert extract_predicted_answer(text) == expected


def test_score():
    preds = ["#### 18", "the answer is 3.0", None, "#### 7", "1,000 dollars"]
    refs = ["18", "3", "5", "8", "1000"]
    assert score(preds, refs) == (3 / 5, 3)
    assert score(["#### 18"], ["Janet ...\n#### 18"]) == (1.0, 1)  # full reference answers work too
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        score(["1", "2"], ["1"])
    with pytest.raises(ValueError, match="nothing to score"):
        score([], [])


def test_heldout_modules_exist():
    root = Path(sysconfig.get_paths()["stdlib"])
    assert 18 <= len(set(STDLIB_HELDOUT_MODULES)) == len(STDLIB_HELDOUT_MODULES)
    assert all((root / rel).is_file() for rel in STDLIB_HELDOUT_MODULES)


def test_builtin_prompts_deterministic():
    first = builtin_prompts(30, prompt_tokens_hint=64)
    assert first == builtin_prompts(30, prompt_tokens_hint=64)
    assert len(first) == 30 and len({p.text for p in first}) == 30
    for p in first:
        assert p.text.strip() and p.text.endswith("\n")
        assert p.answer is None and p.category == "code"
        assert "def " in p.text or "class " in p.text
    # cut verbatim from the held-out files, round-robin: prompt i comes from file i
    root = Path(sysconfig.get_paths()["stdlib"])
    for p, rel in zip(first, STDLIB_HELDOUT_MODULES):
        assert p.text in (root / rel).read_text(encoding="utf-8")
    assert builtin_prompts(3) == builtin_prompts(30)[:3]


def test_builtin_prompts_bad_counts():
    with pytest.raises(ValueError, match="num_prompts=0"):
        builtin_prompts(0)
    with pytest.raises(ValueError, match="built-in set has"):
        builtin_prompts(10**6)
    with pytest.raises(ValueError, match="prompt_tokens_hint"):
        builtin_prompts(3, prompt_tokens_hint=0)


def test_load_prompts_builtin():
    prompts = load_prompts(OmegaConf.create({"name": "builtin"}), 4)
    assert len(prompts) == 4 and all(isinstance(p, Prompt) for p in prompts)


@needs_gsm8k
def test_load_prompts_gsm8k():
    prompts = load_prompts(OmegaConf.create({"name": "gsm8k", "path": str(GSM8K_TEST)}), 5)
    assert len(prompts) == 5
    assert prompts[0].text.startswith("Question: Janet") and prompts[0].text.endswith("\nAnswer:")
    assert (prompts[0].answer, prompts[0].category) == ("18", "gsm8k")
    assert len(load_prompts({"name": "gsm8k", "path": str(GSM8K_TEST)}, None)) == 1319


def test_load_prompts_errors(tmp_path):
    with pytest.raises(ValueError) as err:
        load_prompts({"name": "x"}, 3)
    assert str(err.value) == "unknown data set 'x': choose one of builtin, gsm8k (data=NAME)"
    with pytest.raises(ValueError, match=r"data\.path="):
        load_prompts({"name": "gsm8k", "path": None}, 3)
    with pytest.raises(FileNotFoundError, match=r"data\.path="):
        load_prompts({"name": "gsm8k", "path": str(tmp_path / "missing.jsonl")}, 3)
    with pytest.raises(ValueError, match="has 1 questions"):
        load_prompts({"name": "gsm8k", "path": str(_write(tmp_path, [GOOD]))}, 2)
