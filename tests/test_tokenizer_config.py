"""Checkpoint folders mtpx writes load with transformers' AutoTokenizer as the tokenizer mtpx
uses (lm-eval's `tokenizer=checkpoints/demo`): tokenizer_config.json names PreTrainedTokenizerFast,
the special tokens and the chat template, so AutoTokenizer does not guess a Qwen2 tokenizer from
config.json (which pre-splits digits)."""
import gzip
import inspect
import json
import json.decoder
from pathlib import Path

import pytest

from mtpx.hf.loader import load_folder_tokenizer
from mtpx.hf.tokenizer import load_hf_tokenizer, load_tokenizer, tokenizer_config, write_tokenizer_config
from tests.helpers import DATA_DIR

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "checkpoints" / "demo"
DATA = DATA_DIR


def _texts() -> list[str]:
    """A sample of every shared data set (GSM8K questions and answers, HumanEval prompts and
    solutions, MT-Bench and Spec-Bench turns, Tiny Shakespeare passages) and stdlib source."""
    if not DATA.is_dir():
        pytest.skip(f"{DATA} (the data directory: MTPX_DATA_DIR or conf data_dir) is absent")
    texts = []
    with open(DATA / "gsm8k" / "test.jsonl") as f:
        for line, _ in zip(f, range(100)):
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    with gzip.open(DATA / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
        for line, _ in zip(f, range(50)):
            row = json.loads(line)
            texts += [row["prompt"], row["prompt"] + row["canonical_solution"]]
    for name in ("mt_bench", "spec_bench"):
        with open(DATA / name / "question.jsonl") as f:
            rows = [json.loads(line) for line in f]
        texts += [turn for row in rows[::8] for turn in row["turns"]]
    shakespeare = (DATA / "tinyshakespeare" / "input.txt").read_text()
    texts += [shakespeare[i: i + 2000] for i in range(0, len(shakespeare), len(shakespeare) // 40)]
    source = inspect.getsource(json.decoder)
    texts += [source] + source.split("\n\n")
    texts += ["Answer: 12345 + 67 = 12412", " leading space", "<|endoftext|>x<|pad|>", "émoji 🙂 中文"]
    return texts


def test_committed_demo_config_is_the_generated_one():
    want = tokenizer_config(load_tokenizer(DEMO / "tokenizer.json"))
    assert json.loads((DEMO / "tokenizer_config.json").read_text()) == want


def test_autotokenizer_ids_equal_mtpx_ids_on_the_data_sets():
    auto = transformers.AutoTokenizer.from_pretrained(str(DEMO))
    mtpx_tok = load_folder_tokenizer(DEMO)              # what LLM(model=checkpoints/demo) uses
    plain = load_tokenizer(DEMO / "tokenizer.json")     # mtpx's own tokenizer, as trained
    assert auto.eos_token == "<|endoftext|>" and auto.eos_token_id == 0 and auto.pad_token_id == 1
    texts = _texts()
    assert len(texts) > 300
    differ = 0
    for text in texts:
        ids = auto(text)["input_ids"]
        differ += ids != mtpx_tok.encode(text).ids or ids != plain.encode(text).ids
        assert auto.decode(ids) == text == mtpx_tok.decode(ids, skip_special_tokens=False)
    assert differ == 0


def test_folders_mtpx_writes_carry_the_config(tmp_path):
    """HFTokenizer.save (mtpx checkpoints of Hugging Face models) and the export of an mtpx
    tokenizer write it, with the chat template; AutoTokenizer renders chats as mtpx does."""
    from mtpx.hf.export import copy_tokenizer_files
    from tests.test_hf_tokenizer import CHATML
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer.json").write_text((DEMO / "tokenizer.json").read_text())
    out = tmp_path / "exported"
    out.mkdir()
    assert "tokenizer_config.json" in copy_tokenizer_files(src, out)
    assert (json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"]
            == "PreTrainedTokenizerFast")
    write_tokenizer_config(src, load_tokenizer(src / "tokenizer.json"))
    config = json.loads((src / "tokenizer_config.json").read_text())
    (src / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": CHATML}))
    hf = load_hf_tokenizer(src)
    saved = tmp_path / "saved"
    hf.save(saved)
    config = json.loads((saved / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["chat_template"] == CHATML
    auto = transformers.AutoTokenizer.from_pretrained(str(saved))
    messages = [{"role": "user", "content": "what is 12 + 30?"}]
    assert auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        hf.apply_chat_template(messages)
