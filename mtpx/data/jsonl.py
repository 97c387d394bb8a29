"""Reading JSON-lines data files (plain or gzip-compressed), with one clear error per problem.

Every prompt set on disk (GSM8K, Spec-Bench, MT-Bench, HumanEval) is JSON lines: one object per
line. Errors name the file and line and the config key that points at the file, so the message
says both what is wrong and where to fix it.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any

__all__ = ["read_jsonl", "check_fields"]


def read_jsonl(path: str | os.PathLike[str], option: str, what: str, record: str,
               where: str) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSON-lines file, with their 1-based line numbers, in file order.

    A name ending in ``.gz`` is read through gzip. Blank lines are skipped.

    Args:
        path: the file.
        option: the config key naming the file (``data.path``), quoted in error messages.
        what: the data set's name for messages ("GSM8K", "Spec-Bench", ...).
        record: what one line must be, for messages ("an object with 'question' and 'answer'").
        where: where the file is by default and where it comes from, for the missing-file message.

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names ``option`` and ``where``).
        ValueError: not gzip (for ``.gz``), not UTF-8, a line is not JSON or not an object, or no
            records; the message is ``{path}[:{lineno}]: ...``.
    """
    path = Path(path)
    hint = f"a {what} {'JSONL.GZ' if path.name.endswith('.gz') else 'JSONL'} file"
    if not path.is_file():
        raise FileNotFoundError(
            f"{what} file not found: {path} (resolved: {path.resolve()}); point {option}=... at "
            f"{hint}; relative paths are resolved against the working directory ({where})"
        )
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"{path}: not a readable gzip file ({err}); point {option}=... at "
                             f"{hint}") from None
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); "
                         f"point {option}=... at {hint}") from None
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: malformed JSON ({err}); each line of a {what} file "
                             f"must be {record}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}; "
                             f"each line of a {what} file must be {record}")
        rows.append((lineno, obj))
    if not rows:
        raise ValueError(f"{path} holds no records: point {option}=... at a non-empty {what} JSONL")
    return rows


def check_fields(obj: dict[str, Any], types: dict[str, type], path: Path | str, lineno: int,
                 what: str, record: str) -> None:
    """Raise ValueError ``{path}:{lineno}: key 'k' is missing`` (or ``is not a string``, ...) when
    a key of ``types`` is absent from ``obj`` or has another type."""
    names = {str: "a string", list: "a list", int: "an integer"}
    for key, kind in types.items():
        if isinstance(obj.get(key), kind):
            continue
        problem = ("missing" if key not in obj else
                   f"not {names.get(kind, kind.__name__)} ({type(obj[key]).__name__})")
        raise ValueError(f"{path}:{lineno}: key '{key}' is {problem}; each line of a {what} file "
                         f"must be {record}")
