"""Prompt sets for generation benchmarks: the built-in held-out code prompts, GSM8K, Spec-Bench,
MT-Bench, HumanEval and random token-id prompts (``DATA_SETS``; ``load_prompts`` dispatches on
the ``data`` config section).

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

from mtpx.data.chat import has_chat_template, interleave_categories, load_questions, render_chat
from mtpx.data.gsm8k import extract_reference_answer, format_example, format_prompt, load_gsm8k
from mtpx.data.humaneval import load_humaneval
from mtpx.data.random_prompts import random_token_ids, special_token_ids
from mtpx.data.stdlib import stdlib_dir, stdlib_files

__all__ = [
    "Prompt",
    "STDLIB_HELDOUT_MODULES",
    "CHARS_PER_TOKEN",
    "DATA_SETS",
    "CHAT_SETS",
    "builtin_prompts",
    "load_prompts",
    "check_data_config",
    "chat_template_applies",
]


@dataclass
class Prompt:
    """One benchmark prompt.

    Attributes:
        text: the prompt text (after the chat template, when one was applied; "" for random
            token-id prompts).
        answer: the reference final answer when the set is scored (GSM8K), else None.
        category: the sub-set the prompt belongs to, for per-category reporting ("gsm8k",
            "code", "humaneval", "random", Spec-Bench's subtask, MT-Bench's category).
        token_ids: the prompt as token ids, given to the engine instead of ``text`` (random
            prompts; chat-templated prompts, encoded without adding special tokens); None = the
            engine encodes ``text``.
        output_len: decode exactly this many tokens, ignoring eos (random prompts); None = the
            client's max_tokens, stopping at eos.
    """

    text: str
    answer: str | None = None
    category: str = "default"
    token_ids: list[int] | None = None
    output_len: int | None = None

    @property
    def engine_input(self) -> str | list[int]:
        """What ``LLM.generate`` gets for this prompt: ``token_ids`` when set, else ``text``."""
        return self.token_ids if self.token_ids is not None else self.text


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

DATA_SETS = ("builtin", "gsm8k", "spec_bench", "mt_bench", "humaneval", "random")
CHAT_SETS = ("spec_bench", "mt_bench")
"""The sets whose prompts go through the model's chat template (``data.chat_template``)."""


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


def _split_files(split: str) -> list[str]:
    """The stdlib files (relative paths) of a built-in split whose definitions parse here."""
    if split == "test":
        return list(STDLIB_HELDOUT_MODULES)
    if split != "train":
        raise ValueError(f"data.split={split!r}: the built-in set's split is 'test' (held-out modules) or "
                         "'train' (the other stdlib files)")
    root, rels = stdlib_dir(), []
    for path in stdlib_files():
        rel = path.relative_to(root).as_posix()
        try:
            _header_spans(rel)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a file written for another Python version, or not UTF-8
        rels.append(rel)
    return rels


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


def builtin_prompts(num_prompts: int | None, prompt_tokens_hint: int = 128,
                    split: str = "test") -> list[Prompt]:
    """Deterministic code-continuation prompts cut from ``STDLIB_HELDOUT_MODULES`` (split "test")
    or from the other stdlib files, the ones mode=train's "stdlib" source reads (split "train":
    ``mtpx.data.stdlib.stdlib_files()``, e.g. code prompts for mode=distill that share no file
    with the evaluation's; files that do not parse on this Python are skipped).

    Prompts are taken round-robin over the files (the 1st definition of each file, then the 2nd,
    ...), so a small set spans many files. The same interpreter always gives the same prompts;
    different CPython versions differ slightly because their sources do. No network access and
    no files outside the Python install.

    Args:
        num_prompts: how many prompts; None = all (several hundred for "test").
        prompt_tokens_hint: target prompt length in tokens, converted at ``CHARS_PER_TOKEN``
            characters per token; a header longer than that is kept whole.
        split: "test" (the held-out modules) or "train" (every other library file).

    Returns:
        ``num_prompts`` prompts with category "code" and no answer.

    Raises:
        ValueError: ``num_prompts`` < 1 or more than there are, ``prompt_tokens_hint`` < 1, or
            an unknown ``split``.
        FileNotFoundError: a held-out source file is missing from the install.
    """
    if prompt_tokens_hint < 1:
        raise ValueError(f"prompt_tokens_hint must be >= 1 token, got {prompt_tokens_hint}")
    max_chars = prompt_tokens_hint * CHARS_PER_TOKEN
    per_file = [(_stdlib_source(rel), _header_spans(rel)) for rel in _split_files(split)]
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


def load_prompts(data_cfg: Mapping[str, Any], num_prompts: int | None, tokenizer: Any = None,
                 vocab_size: int | None = None, *, num_prompts_key: str = "num_prompts") -> list[Prompt]:
    """Load the prompt set that the ``data`` config section names.

    Args:
        data_cfg: the ``data`` section (OmegaConf ``DictConfig`` or mapping); ``name`` is one of
            ``DATA_SETS``:

            - "builtin": optional ``prompt_tokens`` (the length hint, default 128) and ``split``
              ("test": the held-out modules, default; "train": the other stdlib files);
              category "code".
            - "gsm8k": ``path`` (a GSM8K JSONL file); prompts are ``format_prompt(question)`` with
              the reference final answer, category "gsm8k"; optional ``num_fewshot``: prepend that
              many solved examples from ``fewshot_path`` (the train split), separated by blank
              lines, the same prefix for every question, as lm-evaluation-harness's few-shot GSM8K.
            - "spec_bench" / "mt_bench": ``path`` (FastChat ``question.jsonl``); the first turn of
              each question, through the tokenizer's chat template when ``chat_template`` (default
              true) and the tokenizer has one (see :func:`chat_template_applies`), else the raw
              turn; category: Spec-Bench's subtask / MT-Bench's category
              (:mod:`mtpx.data.chat`); optional ``categories``: keep only these (a list or one
              name). Questions are taken round-robin over the categories (first of each, second of
              each, ...), so the first N prompts span every category.
            - "humaneval": ``path`` (``HumanEval.jsonl.gz``); the ``prompt`` field as raw text,
              category "humaneval".
            - "random": ``input_len`` random token ids per prompt and exactly ``output_len``
              output tokens (ignore_eos), seeded with ``seed`` (default 0); category "random"
              (:mod:`mtpx.data.random_prompts`). Needs ``num_prompts``.
        num_prompts: take the first this many prompts; None = the whole set.
        tokenizer: the model's tokenizer: the chat template of the chat sets, the special tokens
            left out of random prompts. None = raw text / no ids left out.
        vocab_size: the model's vocabulary size, for random prompts (ids are drawn below it and
            below the tokenizer's vocabulary size).
        num_prompts_key: the config key of ``num_prompts`` for messages (``eval.num_prompts``).

    Raises:
        ValueError: unknown ``name``, a set without ``path``, a bad key value (the message names
            ``data.KEY`` and the fix), ``num_prompts`` < 1 or larger than the set, a malformed
            file (``{path}:{lineno}: ...``), a chat template that fails.
        FileNotFoundError: the data file (or a stdlib source file) is missing.
    """
    name = data_cfg.get("name")
    if name == "builtin":
        return builtin_prompts(num_prompts, prompt_tokens_hint=data_cfg.get("prompt_tokens") or 128,
                               split=data_cfg.get("split") or "test")
    if name == "gsm8k":
        return _gsm8k_prompts(data_cfg, num_prompts, num_prompts_key)
    if name in CHAT_SETS:
        return _chat_prompts(data_cfg, num_prompts, tokenizer, num_prompts_key)
    if name == "humaneval":
        path = _path(data_cfg, "/path/to/humaneval/HumanEval.jsonl.gz")
        rows = _take(load_humaneval(path), num_prompts, num_prompts_key, path, "problems")
        return [Prompt(r["prompt"], None, "humaneval") for r in rows]
    if name == "random":
        return _random_prompts(data_cfg, num_prompts, tokenizer, vocab_size, num_prompts_key)
    raise ValueError(f"unknown data set '{name}': choose one of {', '.join(DATA_SETS)} (data=NAME)")


def _gsm8k_prompts(data_cfg: Mapping[str, Any], num_prompts: int | None,
                   num_prompts_key: str) -> list[Prompt]:
    """data=gsm8k (:func:`load_prompts`): the questions, after the few-shot prefix."""
    shots = data_cfg.get("num_fewshot") or 0
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise ValueError(f"data.num_fewshot={shots!r}: must be an integer >= 0 (0 = zero-shot)")
    path = _path(data_cfg, "/path/to/gsm8k/test.jsonl")
    rows = _take(load_gsm8k(path), num_prompts, num_prompts_key, path, "questions")
    prefix = _fewshot_prefix(data_cfg, shots) if shots else ""
    return [
        Prompt(prefix + format_prompt(r["question"]), extract_reference_answer(r["answer"]), "gsm8k")
        for r in rows
    ]


def _fewshot_prefix(data_cfg: Mapping[str, Any], shots: int) -> str:
    """The first ``shots`` (>= 1) solved examples of ``data.fewshot_path``, each followed by a blank
    line; ValueError naming the key when it is not set or has fewer examples."""
    fewshot_path = data_cfg.get("fewshot_path")
    if not fewshot_path:
        raise ValueError("data.num_fewshot needs solved examples: set "
                         "data.fewshot_path=/path/to/gsm8k/train.jsonl")
    train = load_gsm8k(fewshot_path, option="data.fewshot_path")
    if not 0 < shots <= len(train):
        raise ValueError(f"data.num_fewshot={shots}: {fewshot_path} has {len(train)} examples")
    return "".join(format_example(r["question"], r["answer"]) + "\n\n" for r in train[:shots])


def _chat_prompts(data_cfg: Mapping[str, Any], num_prompts: int | None, tokenizer: Any,
                  num_prompts_key: str) -> list[Prompt]:
    """data=spec_bench / mt_bench (:func:`load_prompts`): first turns, round-robin over the
    categories, through the chat template when :func:`chat_template_applies`."""
    name = data_cfg.get("name")
    what = "Spec-Bench" if name == "spec_bench" else "MT-Bench"
    path = _path(data_cfg, f"/path/to/{name}/question.jsonl")
    rows = _select_categories(load_questions(path, what), data_cfg.get("categories"), path)
    rows = _take(interleave_categories(rows, lambda r: r["category"]), num_prompts,
                 num_prompts_key, path, "questions")
    if not chat_template_applies(data_cfg, tokenizer):
        return [Prompt(r["turns"][0], None, r["category"]) for r in rows]
    prompts = []
    for r in rows:
        text, ids = render_chat(r["turns"][0], tokenizer)
        prompts.append(Prompt(text, None, r["category"], token_ids=ids))
    return prompts


def _random_prompts(data_cfg: Mapping[str, Any], num_prompts: int | None, tokenizer: Any,
                    vocab_size: int | None, num_prompts_key: str) -> list[Prompt]:
    """data=random (:func:`load_prompts`): token ids below the smaller of ``vocab_size`` and the
    tokenizer's vocabulary, without its special tokens."""
    input_len, output_len, seed = _random_args(data_cfg, num_prompts, num_prompts_key)
    sizes = [v for v in (vocab_size, tokenizer.get_vocab_size() if tokenizer is not None else None)
             if v is not None]
    if not sizes:
        raise ValueError("random prompts need the vocabulary: pass vocab_size= (the model's) "
                         "or tokenizer=")
    ids = random_token_ids(num_prompts, input_len, min(sizes), seed, special_token_ids(tokenizer))
    return [Prompt("", None, "random", token_ids=x, output_len=output_len) for x in ids]


def check_data_config(data_cfg: Mapping[str, Any], num_prompts: int | None, *,
                      num_prompts_key: str = "num_prompts") -> None:
    """Raise what :func:`load_prompts` would raise for this config, without a model or tokenizer
    (call it before loading a model, so a data error does not wait for the weights). The data
    files are read; chat templates are not applied and random prompts not drawn."""
    if data_cfg.get("name") == "random":
        _random_args(data_cfg, num_prompts, num_prompts_key)
    else:
        load_prompts(data_cfg, num_prompts, num_prompts_key=num_prompts_key)


def chat_template_applies(data_cfg: Mapping[str, Any], tokenizer: Any) -> bool | None:
    """Whether :func:`load_prompts` renders this set through the tokenizer's chat template: None
    for a set that is not a chat set (``CHAT_SETS``), else True when ``data.chat_template`` (default
    true) and the tokenizer has a template, False otherwise (the raw first-turn text is sent).

    Raises:
        ValueError: ``data.chat_template`` is not true or false.
    """
    if data_cfg.get("name") not in CHAT_SETS:
        return None
    wanted = data_cfg.get("chat_template", True)
    if not isinstance(wanted, bool):
        raise ValueError(f"data.chat_template={wanted!r}: must be true (use the model's chat "
                         "template when it has one) or false (send the raw turn text)")
    return wanted and has_chat_template(tokenizer)


def _path(data_cfg: Mapping[str, Any], example: str) -> str:
    """``data.path``; ValueError naming the key when it is not set."""
    path = data_cfg.get("path")
    if not path:
        raise ValueError(f"data={data_cfg.get('name')} needs a file: set data.path={example}")
    return str(path)


def _take(rows: list, num_prompts: int | None, key: str, source: str, noun: str) -> list:
    """The first ``num_prompts`` rows (all for None); ValueError naming ``key`` when out of range."""
    if num_prompts is not None and not 1 <= num_prompts <= len(rows):
        raise ValueError(f"{key}={num_prompts}: {source} has {len(rows)} {noun}; ask for 1 to that "
                         "many (or null for all of them)")
    return rows[:num_prompts]


def _select_categories(rows: list[dict], categories: Any, path: str) -> list[dict]:
    """The rows of ``categories`` (a name or a list of names; None = all rows).

    Raises:
        ValueError: a name that no row has (the message lists the file's categories).
    """
    if categories is None:
        return rows
    wanted = [categories] if isinstance(categories, str) else list(categories)
    present = list(dict.fromkeys(r["category"] for r in rows))
    for c in wanted:
        if c not in present:
            raise ValueError(f"data.categories: {path} has no category {c!r}; choose from "
                             f"{', '.join(present)} (data.categories=[NAME,...], null = all)")
    if not wanted:
        raise ValueError("data.categories=[] selects nothing: name categories, or null for all")
    return [r for r in rows if r["category"] in wanted]


def _positive_int(data_cfg: Mapping[str, Any], key: str, minimum: int, meaning: str) -> int:
    value = data_cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"data.{key}={value!r}: must be an integer >= {minimum} ({meaning})")
    return value


def _random_args(data_cfg: Mapping[str, Any], num_prompts: int | None, key: str) -> tuple[int, int, int]:
    """(input_len, output_len, seed) of data=random; ValueError naming the key otherwise."""
    input_len = _positive_int(data_cfg, "input_len", 1, "prompt tokens per request")
    output_len = _positive_int(data_cfg, "output_len", 1,
                               "output tokens per request, decoded with ignore_eos")
    seed = _positive_int(data_cfg, "seed", 0, "the seed of the random token ids") \
        if data_cfg.get("seed") is not None else 0
    if num_prompts is None:
        raise ValueError(f"data=random has no fixed size: set {key}=N (how many random prompts)")
    if num_prompts < 1:
        raise ValueError(f"{key}={num_prompts}: ask for at least 1 prompt")
    return input_len, output_len, seed
