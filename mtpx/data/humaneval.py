"""HumanEval: the 164 code-completion prompts (function signature plus docstring).

Source: openai/human-eval ``data/HumanEval.jsonl.gz`` (Chen et al. 2021, arXiv:2107.03374), read from
the data directory's humaneval/ by default (`data_dir`, conf/config.yaml). Each line is ``{"task_id",
"prompt", "entry_point", "canonical_solution", "test"}``. Only ``prompt`` is used, as raw text (code
completion, as HumanEval is run); nothing from the file is ever executed.
"""

from __future__ import annotations

import os

from mtpx.data.jsonl import check_fields, read_jsonl

__all__ = ["load_humaneval"]

_RECORD = "an object with string 'task_id' and 'prompt'"


def load_humaneval(path: str | os.PathLike[str], option: str = "data.path") -> list[dict[str, str]]:
    """Read HumanEval (``.jsonl.gz`` or uncompressed ``.jsonl``) into ``[{"task_id", "prompt"}, ...]``
    in file order.

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names ``option``).
        ValueError: not gzip / not UTF-8, or a line is not a JSON object with string ``task_id``
            and ``prompt`` (``{path}:{lineno}: ...``).
    """
    rows = []
    for lineno, obj in read_jsonl(path, option, "HumanEval", _RECORD,
                                  "by default humaneval/HumanEval.jsonl.gz in the data directory, "
                                  "data_dir=DIR or MTPX_DATA_DIR"):
        check_fields(obj, {"task_id": str, "prompt": str}, path, lineno, "HumanEval", _RECORD)
        rows.append({"task_id": obj["task_id"], "prompt": obj["prompt"]})
    return rows
