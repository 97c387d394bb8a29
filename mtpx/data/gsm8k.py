"""GSM8K: loading the JSONL files, the prompt format, and answer scoring.

Source: openai/grade-school-math (Cobbe et al. 2021, arXiv:2110.14168), read from the
data directory's gsm8k/ by default (`data_dir`, conf/config.yaml). Each line is
``{"question": str, "answer": str}``; the answer's final line is ``#### <number>``. Scoring compares the
final number exactly, after normalization ("1,000" -> "1000", "5.0" -> "5").
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

from mtpx.data.jsonl import check_fields, read_jsonl

__all__ = [
    "format_prompt",
    "format_example",
    "load_gsm8k",
    "extract_reference_answer",
    "extract_predicted_answer",
    "normalize_number",
    "score",
]

_ANSWER_MARK = "####"
_RECORD = "an object with string 'question' and 'answer'"
# A number: optional minus, digits with optional thousands commas, optional decimals; or ".5".
_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")


def format_prompt(question: str) -> str:
    """The prompt for one question: ``"Question: {question}\\nAnswer:"``."""
    return f"Question: {question}\nAnswer:"


def format_example(question: str, answer: str) -> str:
    """A training example: ``format_prompt(question) + " " + answer``."""
    return format_prompt(question) + " " + answer


def load_gsm8k(path: str | os.PathLike[str], option: str = "data.path") -> list[dict[str, str]]:
    """Read a GSM8K JSONL file into ``[{"question": str, "answer": str}, ...]`` in file order.

    Blank lines are skipped; other keys on a line are dropped. ``option`` is the config key that
    names the file, quoted in error messages (``data.path`` for eval, ``train.gsm8k_path``).

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names ``option``).
        ValueError: the file is empty or not UTF-8, or a line is not a JSON object with string
            ``question`` and ``answer`` whose answer has a "####" line; the message is
            ``{path}:{lineno}: ...``.
    """
    rows: list[dict[str, str]] = []
    for lineno, obj in read_jsonl(path, option, "GSM8K", _RECORD,
                                  "by default gsm8k/{train,test}.jsonl in the data directory, data_dir=DIR "
                                  "or MTPX_DATA_DIR; the files are grade-school-math's "
                                  "data/{train,test}.jsonl"):
        check_fields(obj, {"question": str, "answer": str}, path, lineno, "GSM8K", _RECORD)
        if _ANSWER_MARK not in obj["answer"]:
            raise ValueError(f"{path}:{lineno}: the answer has no '{_ANSWER_MARK}' line with the "
                             "final result; each GSM8K answer ends with '#### <number>'")
        rows.append({"question": obj["question"], "answer": obj["answer"]})
    return rows


def extract_reference_answer(answer: str) -> str:
    """The final answer of a GSM8K reference: the text after "####", commas removed, stripped.

    Raises:
        ValueError: ``answer`` has no "####" line.
    """
    if _ANSWER_MARK not in answer:
        raise ValueError(
            f"GSM8K reference answer has no '{_ANSWER_MARK}' line: {answer[-80:]!r}; "
            "pass the 'answer' field of a GSM8K record"
        )
    return answer.split(_ANSWER_MARK)[-1].replace(",", "").strip()


def normalize_number(text: str) -> str:
    """Canonical form of a number string: commas and "$" dropped, "5.0" -> "5", "0.50" -> "0.5".

    A string that is not a number is returned stripped, unchanged otherwise.
    """
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return text.strip()
    if not value.is_finite():
        return text.strip()
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_predicted_answer(text: str) -> str | None:
    """The model's final answer in generated ``text``, normalized; None when it holds no number.

    The number right after the first "####" when there is one; otherwise the last number in the
    text, looked for only before a line starting with "Question:" (a base model may go on to
    invent the next example).
    """
    mark = text.find(_ANSWER_MARK)
    if mark >= 0:
        match = _NUMBER.match(text[mark + len(_ANSWER_MARK) :].lstrip().lstrip("$").lstrip())
        if match:
            return normalize_number(match.group())
    body = text.split("\nQuestion:", 1)[0]
    numbers = _NUMBER.findall(body)
    return normalize_number(numbers[-1]) if numbers else None


def score(predicted_texts: Sequence[str | None], references: Sequence[str]) -> tuple[float, int]:
    """Exact-match accuracy of generated texts against GSM8K reference answers.

    Args:
        predicted_texts: generated texts; None (a failed request) counts as wrong.
        references: final answers (as from :func:`extract_reference_answer`) or full GSM8K
            answer texts with a "####" line.

    Returns:
        ``(accuracy, num_correct)`` with accuracy = num_correct / len(references), in [0, 1].

    Raises:
        ValueError: the two sequences differ in length or are empty.
    """
    if len(predicted_texts) != len(references):
        raise ValueError(
            f"score: {len(predicted_texts)} predictions for {len(references)} references; "
            "pass one generated text per prompt, in prompt order"
        )
    if not references:
        raise ValueError("score: nothing to score; pass at least one prediction and reference")
    num_correct = 0
    for text, ref in zip(predicted_texts, references):
        if _ANSWER_MARK in ref:
            ref = extract_reference_answer(ref)
        predicted = extract_predicted_answer(text) if text is not None else None
        if predicted is not None and predicted == normalize_number(ref):
            num_correct += 1
    return num_correct / len(references), num_correct
