"""What a request's output must match: vLLM's `StructuredOutputsParams`
(vllm/sampling_params.py), plain Python (the grammar engine is the worker side's:
mtpx/structured/)."""
from __future__ import annotations

import json
from dataclasses import dataclass

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint, as vLLM's: json: a JSON schema (a dict, or its JSON text) the output
    must be an instance of; regex: a regular expression the whole output must match; choice: a
    list of strings, the output is one of them; grammar: an EBNF (GBNF, with `::=`) or Lark
    grammar whose `root` / `start` rule the output must match; json_object: True for any JSON
    object. disable_any_whitespace: JSON without optional whitespace (compact output).
    Raises ValueError naming the field when none or several are set or one has the wrong type."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self):
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs: exactly one of {', '.join(KINDS)} must be set, got "
                             f"{len(given)} ({', '.join(given) or 'none'})")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(f"structured_outputs.json: must be a JSON schema (a dict or its JSON text), "
                             f"not {type(self.json).__name__}")
        for key in ("regex", "grammar"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"structured_outputs.{key}: must be a non-empty string")
        if self.choice is not None and not (isinstance(self.choice, (list, tuple)) and self.choice
                                            and all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured_outputs.choice: must be a non-empty list of non-empty strings")
        if self.json_object not in (None, True, False):
            raise ValueError("structured_outputs.json_object: must be True or False")

    @property
    def kind(self) -> str:
        """The constraint set: one of KINDS."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple[str, str, bool]:
        """(kind, canonical text, disable_any_whitespace): equal keys compile to the same grammar."""
        kind, value = self.kind, getattr(self, self.kind)
        if kind == "json" and isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        elif kind == "choice":
            value = json.dumps(list(value))
        return kind, str(value), self.disable_any_whitespace
