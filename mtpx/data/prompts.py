"""Prompt sets for generation benchmarks: the built-in held-out code prompts, and GSM8K.

The built-in set needs no download: it is cut from Python standard-library source files of the
running interpreter. Those files (``STDLIB_HELDOUT_MODULES``) must be left out of any training
corpus, so the prompts are unseen text for our models. Each prompt ends right after a
definition's header (decorators, signature and the opening line of its docstring), preceded by as
many of the file's preceding lines as fit the length hint, so the model continues code.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpx.data.gsm8k import extract_reference_answer, format_example, format_prompt, load_gsm8k

__all__ = [
    "Prompt",
    "STDLIB_HELDOUT_MODULES",
    "CHARS_PER_TOKEN",
    "DATA_SETS",
    "builtin_prompts",
    "load_prompts",
]


@dataclass
class Prompt:
    """One benchmark prompt.

    Attributes:
        text: the prompt text given to the model.
        answer: the reference final answer when the set is scored (GSM8K), else None.
        category: the sub-set the prompt belongs to, for per-category reporting.
    """

    text: str
    answer: str | None = None
    category: str = "default"


# Paths relative to sysconfig.get_paths()["stdlib"]. Each is a plain module present in CPython
# 3.10 to 3.13 (none of the PEP 594 removals, none turned into a package).
STDLIB_HELDOUT_MODULES: tuple[str, ...] = (
    "textwrap.py",
    "json/encoder.py",
    "json/decoder.py",
    "shlex.py",
    "fractions.py",
    "difflib.py",
    "heapq.py",
    "bisect.py",
    "calendar.py",
    "csv.py",
    "colorsys.py",
    "statistics.py",
    "graphlib.py",
    "html/parser.py",
    "ipaddress.py",
    "sched.py",
    "fnmatch.py",
    "netrc.py",
    "pprint.py",
    "reprlib.py",
    "filecmp.py",
    "queue.py",
)

CHARS_PER_TOKEN = 4
"""Rough characters per BPE token of Python source, used to turn a token hint into characters."""

DATA_SETS = ("builtin", "gsm8k")


def _stdlib_source(relpath: str) -> list[str]:
    """Lines (with line ends) of one held-out stdlib file.

    Raises:
        FileNotFoundError: the interpreter ships without that source file.
    """
    path = Path(sysconfig.get_paths()["stdlib"]) / relpath
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: standard-library source missing; built-in prompts need the .py sources of "
            "the Python install (use a full CPython build, or pick another set with data=gsm8k)"
        )
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


@functools.lru_cache(maxsize=None)
def _header_spans(relpath: str) -> tuple[tuple[int, int], ...]:
    """(first, last) 0-based line spans of definition headers in one held-out file, in file order.

    Definitions are top-level functions and classes and the methods of top-level classes. A
    header runs from the first decorator to the opening line of the docstring, or to the line
    before the body when there is no docstring. One-line definitions are skipped.
    """
    tree = ast.parse("".join(_stdlib_source(relpath)), filename=relpath)
    nodes: list[ast.AST] = []
    for node in tree.body:
        nodes.append(node)
        if isinstance(node, ast.ClassDef):
            nodes.extend(node.body)
    spans = []
    for node in nodes:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        body0 = node.body[0]
        has_doc = (
            isinstance(body0, ast.Expr)
            and isinstance(body0.value, ast.Constant)
            and isinstance(body0.value.value, str)
        )
        if body0.lineno == node.lineno:
            continue  # "def f(): return x": no header without its body
        last = body0.lineno if has_doc else body0.lineno - 1
        spans.append((first - 1, last - 1))
    return tuple(spans)


def _cut_prompt(lines: list[str], first: int, last: int, max_chars: int) -> str:
    """Header lines ``first..last`` plus as many whole preceding lines as fit in ``max_chars``."""
    header = lines[first : last + 1]
    size = sum(map(len, header))
    start = first
    while start > 0 and size + len(lines[start - 1]) <= max_chars:
        start -= 1
        size += len(lines[start])
    while start < first and not lines[start].strip():
        start += 1  # no leading blank lines
    text = "".join(lines[start : last + 1])
    return text if text.endswith("\n") else text + "\n"


def builtin_prompts(num_prompts: int | None, prompt_tokens_hint: int = 128) -> list[Prompt]:
    """Deterministic code-continuation prompts cut from ``STDLIB_HELDOUT_MODULES``.

    Prompts are taken round-robin over the files (the 1st definition of each file, then the 2nd,
    ...), so a small set spans many files. The same interpreter always gives the same prompts;
    different CPython versions differ slightly because their sources do. No network access and
    no files outside the Python install.

    Args:
        num_prompts: how many prompts; None = all (several hundred).
        prompt_tokens_hint: target prompt length in tokens, converted at ``CHARS_PER_TOKEN``
            characters per token; a header longer than that is kept whole.

    Returns:
        ``num_prompts`` prompts with category "code" and no answer.

    Raises:
        ValueError: ``num_prompts`` < 1 or more than there are, or ``prompt_tokens_hint`` < 1.
        FileNotFoundError: a held-out source file is missing from the install.
    """
    if prompt_tokens_hint < 1:
        raise ValueError(f"prompt_tokens_hint must be >= 1 token, got {prompt_tokens_hint}")
    max_chars = prompt_tokens_hint * CHARS_PER_TOKEN
    per_file = [(_stdlib_source(rel), _header_spans(rel)) for rel in STDLIB_HELDOUT_MODULES]
    available = sum(len(spans) for _, spans in per_file)
    if num_prompts is None:
        num_prompts = available
    if not 1 <= num_prompts <= available:
        raise ValueError(
            f"num_prompts={num_prompts}: the built-in set has {available} prompts on this Python; "
            "ask for 1 to that many (or use data=gsm8k)"
        )
    prompts: list[Prompt] = []
    for rank in range(max(len(spans) for _, spans in per_file)):
        for lines, spans in per_file:
            if rank < len(spans):
                prompts.append(Prompt(_cut_prompt(lines, *spans[rank], max_chars), None, "code"))
                if len(prompts) == num_prompts:
                    return prompts
    return prompts


def load_prompts(data_cfg: Mapping[str, Any], num_prompts: int | None) -> list[Prompt]:
    """Load the prompt set that the ``data`` config section names.

    Args:
        data_cfg: the ``data`` section (OmegaConf ``DictConfig`` or mapping) with ``name``:
            "builtin" (optional ``prompt_tokens``: the length hint, default 128) or "gsm8k"
            (``path``: a GSM8K JSONL file; prompts are ``format_prompt(question)`` with the
            reference final answer, category "gsm8k"; optional ``num_fewshot``: prepend that many
            solved examples from ``fewshot_path`` (the train split), separated by blank lines,
            the same prefix for every question, as lm-evaluation-harness's few-shot GSM8K).
        num_prompts: take the first this many prompts; None = the whole set.

    Raises:
        ValueError: unknown ``name``, gsm8k without ``path``, or ``num_prompts`` < 1 or larger
            than the set.
        FileNotFoundError: the GSM8K file (or a stdlib source file) is missing.
    """
    name = data_cfg.get("name")
    if name == "builtin":
        return builtin_prompts(num_prompts, prompt_tokens_hint=data_cfg.get("prompt_tokens") or 128)
    if name == "gsm8k":
        path = data_cfg.get("path")
        if not path:
            raise ValueError("data=gsm8k needs a file: set data.path=/path/to/gsm8k/test.jsonl")
        rows = load_gsm8k(path)
        if num_prompts is not None and not 1 <= num_prompts <= len(rows):
            raise ValueError(
                f"num_prompts={num_prompts}: {path} has {len(rows)} questions; ask for 1 to that many"
            )
        rows = rows[:num_prompts]
        prefix = ""
        shots = int(data_cfg.get("num_fewshot") or 0)
        if shots:
            fewshot_path = data_cfg.get("fewshot_path")
            if not fewshot_path:
                raise ValueError("data.num_fewshot needs solved examples: set "
                                 "data.fewshot_path=/path/to/gsm8k/train.jsonl")
            train = load_gsm8k(fewshot_path, option="data.fewshot_path")
            if not 0 < shots <= len(train):
                raise ValueError(f"data.num_fewshot={shots}: {fewshot_path} has {len(train)} examples")
            prefix = "".join(format_example(r["question"], r["answer"]) + "\n\n" for r in train[:shots])
        return [
            Prompt(prefix + format_prompt(r["question"]), extract_reference_answer(r["answer"]), "gsm8k")
            for r in rows
        ]
    raise ValueError(f"unknown data set '{name}': choose one of {', '.join(DATA_SETS)} (data=NAME)")
