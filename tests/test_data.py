"""GSM8K loading, answer extraction and scoring; built-in prompts; the prompt-set dispatcher."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mtpx.data import (
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_CATEGORIES,
    STDLIB_HELDOUT_MODULES,
    Prompt,
    builtin_prompts,
    chat_template_applies,
    check_data_config,
    load_humaneval,
    load_questions,
    random_token_ids,
    extract_predicted_answer,
    extract_reference_answer,
    format_example,
    format_prompt,
    load_gsm8k,
    load_prompts,
    score,
)

from tests.helpers import DATA_DIR

GSM8K_TEST = DATA_DIR / "gsm8k" / "test.jsonl"
needs_gsm8k = pytest.mark.skipif(not GSM8K_TEST.is_file(),
                                 reason=f"{GSM8K_TEST} is absent "
                                        "(the data directory: MTPX_DATA_DIR or conf data_dir)")
SPEC_BENCH = DATA_DIR / "spec_bench" / "question.jsonl"
MT_BENCH = DATA_DIR / "mt_bench" / "question.jsonl"
HUMANEVAL = DATA_DIR / "humaneval" / "HumanEval.jsonl.gz"


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


def test_builtin_train_split_shares_no_file_with_the_test_split():
    """data.split=train cuts prompts from the stdlib files training reads, round-robin over them in
    stdlib_files' order: none from a held-out module, none equal to a test-split prompt."""
    from mtpx.data.stdlib import stdlib_files
    train = builtin_prompts(40, prompt_tokens_hint=64, split="train")
    assert train == builtin_prompts(40, prompt_tokens_hint=64, split="train")
    assert len({p.text for p in train}) == 40 and all(p.category == "code" for p in train)
    test = {p.text for p in builtin_prompts(None, prompt_tokens_hint=64)}
    assert not test & {p.text for p in train}
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    assert not {f.relative_to(root).as_posix() for f in files} & set(STDLIB_HELDOUT_MODULES)
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files[:80]]
    for p in train[:5]:  # round-robin: the first prompts are the first definitions of the first files
        assert sum(p.text in t for t in texts) >= 1
    heldout = [(root / rel).read_text(encoding="utf-8") for rel in STDLIB_HELDOUT_MODULES]
    assert not any(p.text in t for p in train for t in heldout)
    assert load_prompts({"name": "builtin", "split": "train", "prompt_tokens": 64}, 3) == train[:3]
    with pytest.raises(ValueError, match="data.split='dev'"):
        load_prompts({"name": "builtin", "split": "dev"}, 3)


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
    assert str(err.value) == ("unknown data set 'x': choose one of builtin, gsm8k, spec_bench, mt_bench, "
                              "humaneval, random (data=NAME)")
    with pytest.raises(ValueError, match=r"data\.path="):
        load_prompts({"name": "gsm8k", "path": None}, 3)
    with pytest.raises(FileNotFoundError, match=r"data\.path="):
        load_prompts({"name": "gsm8k", "path": str(tmp_path / "missing.jsonl")}, 3)
    with pytest.raises(ValueError, match="has 1 questions"):
        load_prompts({"name": "gsm8k", "path": str(_write(tmp_path, [GOOD]))}, 2)


# --- Spec-Bench, MT-Bench, HumanEval, random prompts ---------------------------------------------

def _questions(tmp_path: Path, rows: list[tuple[str, list[str]]], name="question.jsonl") -> Path:
    """A FastChat-format question file: (category, turns) per line, ids from 81."""
    path = tmp_path / name
    path.write_text("".join(json.dumps({"question_id": 81 + i, "category": c, "turns": t}) + "\n"
                            for i, (c, t) in enumerate(rows)), encoding="utf-8")
    return path


SPEC_ROWS = [("writing", ["Write a poem.", "Now shorter."]), ("roleplay", ["Be a pirate.", "Again."]),
             ("translation", ["Translate German to English: Hallo"]), ("qa", ["Who is it?"]),
             ("translation", ["Translate German to English: Danke"]), ("qa", ["Where is it?"])]


def test_load_spec_bench_synthetic(tmp_path):
    """Subtasks as Spec-Bench reports them (MT-Bench's categories -> mt_bench), the first turn, and
    round-robin over the subtasks so the first prompts span all of them."""
    path = _questions(tmp_path, SPEC_ROWS)
    rows = load_questions(path, "Spec-Bench")
    assert [r["category"] for r in rows] == ["mt_bench", "mt_bench", "translation", "qa", "translation", "qa"]
    assert rows[0]["turns"] == ["Write a poem.", "Now shorter."] and rows[0]["question_id"] == 81
    cfg = {"name": "spec_bench", "path": str(path)}
    prompts = load_prompts(cfg, None)
    assert [(p.category, p.text) for p in prompts] == [
        ("mt_bench", "Write a poem."), ("translation", "Translate German to English: Hallo"),
        ("qa", "Who is it?"), ("mt_bench", "Be a pirate."),
        ("translation", "Translate German to English: Danke"), ("qa", "Where is it?")]
    assert all(p.token_ids is None and p.answer is None and p.output_len is None for p in prompts)
    assert [p.category for p in load_prompts(cfg, 3)] == ["mt_bench", "translation", "qa"]
    only = load_prompts({**cfg, "categories": ["qa", "mt_bench"]}, None)
    assert [p.text for p in only] == ["Write a poem.", "Who is it?", "Be a pirate.", "Where is it?"]
    assert [p.text for p in load_prompts({**cfg, "categories": "qa"}, None)] == ["Who is it?", "Where is it?"]


def test_load_mt_bench_synthetic(tmp_path):
    path = _questions(tmp_path,
                      [("writing", ["w1", "w2"]), ("writing", ["w3", "w4"]), ("math", ["m1", "m2"])])
    prompts = load_prompts({"name": "mt_bench", "path": str(path)}, None)
    assert [(p.category, p.text) for p in prompts] == [("writing", "w1"), ("math", "m1"), ("writing", "w3")]


def test_chat_sets_errors(tmp_path):
    path = _questions(tmp_path, SPEC_ROWS)
    cfg = {"name": "spec_bench", "path": str(path)}
    with pytest.raises(ValueError, match=r"data.categories: .* has no category 'math'; choose from "
                                         r"mt_bench, translation, qa"):
        load_prompts({**cfg, "categories": ["math"]}, None)
    with pytest.raises(ValueError, match=r"eval.num_prompts=7: .* has 6 questions"):
        load_prompts(cfg, 7, num_prompts_key="eval.num_prompts")
    with pytest.raises(ValueError, match=r"data.chat_template='yes': must be true"):
        load_prompts({**cfg, "chat_template": "yes"}, None)
    with pytest.raises(FileNotFoundError, match=r"Spec-Bench file not found: .*data\.path=.*"
                                                r"spec_bench/question\.jsonl in the data directory, "
                                                r"data_dir=DIR or MTPX_DATA_DIR"):
        load_prompts({**cfg, "path": str(tmp_path / "nope.jsonl")}, None)
    with pytest.raises(ValueError, match=r"data=mt_bench needs a file: set data.path="):
        load_prompts({"name": "mt_bench", "path": None}, None)
    for line, message in [('{"category": "qa"}', "key 'turns' is missing"),
                          ('{"category": "qa", "turns": []}', "'turns' must be a non-empty list"),
                          ('{"category": 1, "turns": ["x"]}', "key 'category' is not a string"),
                          ('{"category": "qa", "turns": ', "malformed JSON")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"category": "qa", "turns": ["ok"]}\n' + line + "\n")
        with pytest.raises(ValueError) as err:
            load_prompts({"name": "mt_bench", "path": str(bad)}, None)
        assert f"{bad}:2: " in str(err.value) and message in str(err.value), err.value


def _hf_tokenizer(tmp_path, template=True):
    from mtpx.hf.tokenizer import load_hf_tokenizer
    from tests.test_hf_tokenizer import CHATML, make_folder
    config = {"eos_token": "<|im_end|>"} | ({"chat_template": CHATML} if template else {})
    return load_hf_tokenizer(make_folder(tmp_path / ("tmpl" if template else "plain"), config=config))


def test_chat_template_applied_with_hf_tokenizer(tmp_path):
    """A tokenizer with a chat template: the first turn as one user message, with the generation
    prompt; the engine gets the ids of that text encoded without added special tokens."""
    tok = _hf_tokenizer(tmp_path)
    cfg = {"name": "mt_bench", "path": str(_questions(tmp_path, [("writing", ["Hello there", "x"])]))}
    assert chat_template_applies(cfg, tok) is True
    [p] = load_prompts(cfg, None, tok)
    assert p.text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                      "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")
    assert p.text == tok.apply_chat_template([{"role": "user", "content": "Hello there"}])
    assert p.token_ids == tok.encode(p.text, add_special_tokens=False).ids and p.engine_input == p.token_ids
    assert p.token_ids[0] == tok.token_to_id("<|im_start|>") and p.category == "writing"
    # data.chat_template=false: the raw turn
    raw = load_prompts({**cfg, "chat_template": False}, None, tok)
    assert chat_template_applies({**cfg, "chat_template": False}, tok) is False
    assert (raw[0].text, raw[0].token_ids) == ("Hello there", None)


def test_chat_template_fallback_without_template(tmp_path, tiny_tokenizer):
    """No template (mtpx's own tokenizer, an HF tokenizer without one, no tokenizer): raw text."""
    cfg = {"name": "spec_bench", "path": str(_questions(tmp_path, SPEC_ROWS[:1]))}
    for tok in (tiny_tokenizer, _hf_tokenizer(tmp_path, template=False), None):
        assert chat_template_applies(cfg, tok) is False
        assert [(p.text, p.token_ids) for p in load_prompts(cfg, None, tok)] == [("Write a poem.", None)]
    assert chat_template_applies({"name": "gsm8k"}, tiny_tokenizer) is None  # not a chat set


@pytest.fixture
def tiny_tokenizer():
    from mtpx.train.tokenizer import train_tokenizer
    return train_tokenizer(["def f(x):\n    return x + 1\n" * 20], 280)


def test_load_humaneval_gz_and_plain(tmp_path):
    import gzip
    rows = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n    \"\"\"doc\"\"\"\n",
             "entry_point": f"f{i}", "canonical_solution": "    pass\n", "test": "assert False"}
            for i in range(3)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    gz = tmp_path / "HumanEval.jsonl.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    plain = tmp_path / "HumanEval.jsonl"
    plain.write_text(text)
    assert load_humaneval(gz) == load_humaneval(plain) == [{"task_id": r["task_id"], "prompt": r["prompt"]}
                                                           for r in rows]
    prompts = load_prompts({"name": "humaneval", "path": str(gz)}, 2)
    assert [(p.text, p.category) for p in prompts] == [(r["prompt"], "humaneval") for r in rows[:2]]
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"bad.jsonl.gz: not a readable gzip file"):
        load_humaneval(bad)
    bad.write_bytes(gzip.compress(b'{"task_id": "x"}\n'))
    with pytest.raises(ValueError, match=r"bad.jsonl.gz:1: key 'prompt' is missing"):
        load_humaneval(bad)
    with pytest.raises(FileNotFoundError, match=r"HumanEval file not found.*HumanEval.jsonl.gz"):
        load_humaneval(tmp_path / "missing.jsonl.gz")


def test_random_prompts_exact_lengths_and_reproducible(tiny_tokenizer):
    cfg = {"name": "random", "input_len": 37, "output_len": 5, "seed": 3}
    a = load_prompts(cfg, 6, tiny_tokenizer, vocab_size=500)
    assert len(a) == 6 and all(len(p.token_ids) == 37 and p.output_len == 5 for p in a)
    assert all(p.category == "random" and p.text == "" and p.engine_input is p.token_ids for p in a)
    assert a == load_prompts(cfg, 6, tiny_tokenizer, vocab_size=500)  # same seed, same prompts
    assert a != load_prompts({**cfg, "seed": 4}, 6, tiny_tokenizer, vocab_size=500)
    assert load_prompts(cfg, 2, tiny_tokenizer, vocab_size=500) == a[:2]
    ids = {t for p in a for t in p.token_ids}
    vocab = tiny_tokenizer.get_vocab_size()  # 280 < 500: the smaller bound wins
    assert min(ids) >= 2 and max(ids) < vocab  # 0 and 1 are mtpx's special tokens
    assert len(ids) > 50
    # no tokenizer: ids below the model's vocabulary; exclusions are exact
    assert all(t < 10 for p in load_prompts(cfg, 3, vocab_size=10) for t in p.token_ids)
    assert set(sum(random_token_ids(4, 50, 5, 0, exclude={0, 2, 4}), [])) == {1, 3}


@pytest.mark.parametrize("cfg,num_prompts,message", [
    ({"input_len": 0, "output_len": 4}, 3, "data.input_len=0: must be an integer >= 1"),
    ({"input_len": "x", "output_len": 4}, 3, "data.input_len='x'"),
    ({"input_len": 8, "output_len": 0}, 3, "data.output_len=0: must be an integer >= 1"),
    ({"input_len": 8, "output_len": True}, 3, "data.output_len=True"),
    ({"input_len": 8, "output_len": 4, "seed": -1}, 3, "data.seed=-1"),
    ({"input_len": 8, "output_len": 4}, None, "data=random has no fixed size: set bench.num_prompts=N"),
])
def test_random_prompts_errors(cfg, num_prompts, message):
    with pytest.raises(ValueError) as err:
        check_data_config({"name": "random", **cfg}, num_prompts, num_prompts_key="bench.num_prompts")
    assert message in str(err.value)


def test_check_data_config_reads_files_without_a_tokenizer(tmp_path):
    check_data_config({"name": "spec_bench", "path": str(_questions(tmp_path, SPEC_ROWS))}, 6)
    check_data_config({"name": "random", "input_len": 4, "output_len": 4}, 2)
    with pytest.raises(FileNotFoundError, match="MT-Bench file not found"):
        check_data_config({"name": "mt_bench", "path": str(tmp_path / "nope.jsonl")}, 2)


needs = {name: pytest.mark.skipif(not path.is_file(), reason=f"{path} is absent (the data directory: "
                                                             "MTPX_DATA_DIR or conf data_dir)")
         for name, path in (("spec_bench", SPEC_BENCH), ("mt_bench", MT_BENCH), ("humaneval", HUMANEVAL))}


@needs["spec_bench"]
def test_load_real_spec_bench():
    rows = load_questions(SPEC_BENCH, "Spec-Bench")
    assert len(rows) == 480
    assert {c: sum(r["category"] == c for r in rows) for c in SPEC_BENCH_CATEGORIES} == \
        dict.fromkeys(SPEC_BENCH_CATEGORIES, 80)
    prompts = load_prompts({"name": "spec_bench", "path": str(SPEC_BENCH)}, 12)
    assert [p.category for p in prompts] == list(SPEC_BENCH_CATEGORIES) * 2
    assert prompts[0].text.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert prompts[1].text.startswith("Translate German to English:")
    assert prompts[2].text.startswith("Summarize:")


@needs["mt_bench"]
def test_load_real_mt_bench():
    rows = load_questions(MT_BENCH)
    assert len(rows) == 80 and all(len(r["turns"]) == 2 for r in rows)
    assert sorted({r["category"] for r in rows}) == sorted(MT_BENCH_CATEGORIES)
    prompts = load_prompts({"name": "mt_bench", "path": str(MT_BENCH)}, None)
    assert len(prompts) == 80 and [p.category for p in prompts[:8]] == list(MT_BENCH_CATEGORIES)
    assert prompts[0].text == rows[0]["turns"][0]  # question 81, first turn only
    assert prompts[0].text.startswith("Compose an engaging travel blog post")


@needs["humaneval"]
def test_load_real_humaneval():
    rows = load_humaneval(HUMANEVAL)
    assert len(rows) == 164 and rows[0]["task_id"] == "HumanEval/0" and rows[-1]["task_id"] == "HumanEval/163"
    prompts = load_prompts({"name": "humaneval", "path": str(HUMANEVAL)}, None)
    assert prompts[0].text.startswith("from typing import List\n\n\ndef has_close_elements(")
    assert all(p.category == "humaneval" for p in prompts)
