"""Chat prompt sets in FastChat's question format: MT-Bench and Spec-Bench.

Both files are JSON lines ``{"question_id", "category", "turns": [user turn, ...]}`` (Spec-Bench's
80 conversation rows are exactly MT-Bench's 80 questions). A benchmark prompt is the **first
turn**, sent as one user message through the model's chat template
(``tokenizer.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True)``,
as Spec-Bench's and FastChat's inference scripts template every question), or as the raw turn
text when the tokenizer has no template.

Categories:
- MT-Bench: the file's own, ``MT_BENCH_CATEGORIES`` (10 questions each).
- Spec-Bench: its six subtasks, ``SPEC_BENCH_CATEGORIES``. The conversation rows carry MT-Bench's
  categories in the file; they are reported as one subtask, "mt_bench", as Spec-Bench reports them.

Sources: lm-sys/FastChat ``fastchat/llm_judge/data/mt_bench/question.jsonl`` (Zheng et al. 2023,
arXiv:2306.05685); hemingkx/Spec-Bench ``data/spec_bench/question.jsonl`` (Xia et al. 2024,
arXiv:2401.07851). The configs read them from the data directory (`data_dir`, conf/config.yaml):
``DATA_DIR/{mt_bench,spec_bench}/question.jsonl``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from jinja2.exceptions import TemplateError

from mtpx.data.jsonl import check_fields, read_jsonl

__all__ = [
    "MT_BENCH_CATEGORIES",
    "SPEC_BENCH_CATEGORIES",
    "load_questions",
    "has_chat_template",
    "render_chat",
    "interleave_categories",
]

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                       "humanities")
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")

_RECORD = "an object with string 'category' and 'turns' (a non-empty list of user turns)"
_WHERE = {"MT-Bench": "by default mt_bench/question.jsonl in the data directory, data_dir=DIR or "
                       "MTPX_DATA_DIR; the file is FastChat's "
                       "fastchat/llm_judge/data/mt_bench/question.jsonl",
          "Spec-Bench": "by default spec_bench/question.jsonl in the data directory, data_dir=DIR or "
                         "MTPX_DATA_DIR; the file is Spec-Bench's data/spec_bench/question.jsonl"}


def load_questions(path: str | os.PathLike[str], what: str = "MT-Bench",
                   option: str = "data.path") -> list[dict[str, Any]]:
    """Read a FastChat-format question file into ``[{"question_id", "category", "turns"}, ...]``.

    Args:
        path: ``question.jsonl``.
        what: "MT-Bench" (categories as in the file) or "Spec-Bench" (MT-Bench's categories become
            "mt_bench", see the module doc).
        option: the config key that names the file, quoted in error messages.

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names ``option``).
        ValueError: unknown ``what``, or a malformed file: a line is not a JSON object with a string
            ``category`` and a non-empty list of string ``turns`` (``{path}:{lineno}: ...``).
    """
    if what not in _WHERE:
        raise ValueError(f"load_questions: what={what!r}; choose one of {', '.join(_WHERE)}")
    rows = []
    for lineno, obj in read_jsonl(path, option, what, _RECORD, _WHERE[what]):
        check_fields(obj, {"category": str, "turns": list}, path, lineno, what, _RECORD)
        turns = obj["turns"]
        if not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{path}:{lineno}: 'turns' must be a non-empty list of strings; each "
                             f"line of a {what} file must be {_RECORD}")
        category = obj["category"]
        if what == "Spec-Bench" and category in MT_BENCH_CATEGORIES:
            category = "mt_bench"
        rows.append({"question_id": obj.get("question_id"), "category": category, "turns": turns})
    return rows


def has_chat_template(tokenizer: Any) -> bool:
    """True when ``tokenizer`` (an ``mtpx.hf.tokenizer.HFTokenizer``) has a default chat template;
    False for a plain ``tokenizers.Tokenizer`` (mtpx's own checkpoints) or None."""
    return getattr(tokenizer, "chat_template", None) is not None and \
        callable(getattr(tokenizer, "apply_chat_template", None))


def render_chat(turn: str, tokenizer: Any) -> tuple[str, list[int]]:
    """One user turn through the tokenizer's chat template, ready for the assistant's reply.

    Returns ``(text, token_ids)``: the rendered prompt and its ids, encoded without adding special
    tokens (the template already holds them), as transformers' ``apply_chat_template(...,
    tokenize=True)`` does; the engine gets the ids, so no BOS is added twice.

    Raises:
        ValueError: the template failed (the message says how to send raw text instead).
    """
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": turn}],
                                             add_generation_prompt=True)
    except TemplateError as err:
        raise ValueError(f"{err}; set data.chat_template=false to send the raw turn text") from None
    return text, list(tokenizer.encode(text, add_special_tokens=False).ids)


def interleave_categories(items: Sequence[Any], category_of) -> list[Any]:
    """``items`` round-robin over their categories (first-seen order): the first of each
    category, then the second of each, ...; so the first N prompts of a set span its categories."""
    groups: dict[str, list[Any]] = {}
    for item in items:
        groups.setdefault(category_of(item), []).append(item)
    out: list[Any] = []
    for rank in range(max((len(g) for g in groups.values()), default=0)):
        out += [g[rank] for g in groups.values() if rank < len(g)]
    return out
