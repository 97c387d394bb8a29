"""The server's constraint fields as one StructuredOutputsParams (docs/structured_output.md):
OpenAI's `response_format` (json_object, json_schema), vLLM's `structured_outputs` and older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, and tool calling (`tools`
with `tool_choice` "required" or a named function, OpenAI's shape; vLLM's schemas).

At most one of them may be set: two are a 400 naming the second. A constraint the grammar engine
cannot compile is a 400 naming the field it came from.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

from mtpx.core.structured_outputs import StructuredOutputsParams
from mtpx.serve.errors import BadRequest

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}


def _response_format(rf: dict[str, Any]) -> StructuredOutputsParams | None:
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema", spec.get("json_schema")) if isinstance(spec, dict) else None
        if not isinstance(schema, (dict, str)):
            raise BadRequest("response_format.json_schema.schema: give the JSON schema, e.g. "
                             '{"type": "json_schema", "json_schema": {"name": "x", "schema": {...}}}',
                             "response_format")
        return StructuredOutputsParams(json=schema)
    raise BadRequest(f"response_format.type={kind!r}: must be 'text', 'json_object' or 'json_schema'",
                     "response_format")


def _tool(tools: list[dict], name: str) -> dict:
    for t in tools:
        if t.get("type", "function") == "function" and t.get("function", {}).get("name") == name:
            return t["function"]
    raise BadRequest(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")


def tool_schema(tools: list[dict] | None, tool_choice, parallel_tool_calls: bool | None = True
                ) -> dict | None:
    """The JSON schema tool_choice asks for (vLLM's): a named function, its parameters; "required",
    a non-empty array of {"name", "parameters"} objects, one of the tools each (one item at most
    unless parallel_tool_calls, as OpenAI's flag means); None for "none" or "auto" (no
    constraint: the text is returned as content)."""
    if tool_choice in (None, "none", "auto"):
        return None
    if not tools:
        raise BadRequest(f"tool_choice={tool_choice!r} needs tools: give the functions in tools",
                         "tool_choice")
    if not all(isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name")
               for t in tools):
        raise BadRequest("tools: each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                         "\"parameters\": {...}}}", "tools")
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise BadRequest('tool_choice: give {"type": "function", "function": {"name": NAME}}',
                             "tool_choice")
        return _tool(tools, name).get("parameters") or {"type": "object"}
    if tool_choice != "required":
        raise BadRequest(f"tool_choice={tool_choice!r}: must be 'none', 'auto', 'required' or a named "
                         "function", "tool_choice")
    limit = {} if parallel_tool_calls else {"maxItems": 1}
    return {"type": "array", "minItems": 1, **limit, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                        "parameters": t["function"].get("parameters") or {"type": "object"}},
         "required": ["name", "parameters"]} for t in tools]}}


def constraint(body) -> tuple[StructuredOutputsParams | None, str | None]:
    """(the body's one constraint, the field it came from) or (None, None); BadRequest naming the
    field for two constraints or a malformed one."""
    found: list[tuple[StructuredOutputsParams, str]] = []
    field = "response_format"
    try:
        if body.response_format is not None:
            c = _response_format(body.response_format)
            if c is not None:
                found.append((c, field))
        for field, kind in GUIDED.items():
            if getattr(body, field) is not None:
                found.append((StructuredOutputsParams(**{kind: getattr(body, field)}), field))
        field = "structured_outputs"
        if getattr(body, field, None):
            found.append((StructuredOutputsParams(**body.structured_outputs), field))
        field = "tool_choice"
        schema = tool_schema(getattr(body, "tools", None), getattr(body, field, None),
                             getattr(body, "parallel_tool_calls", True))
        if schema is not None:
            found.append((StructuredOutputsParams(json=schema), field))
    except (TypeError, ValueError) as e:
        raise BadRequest(f"{field}: {e}".replace("\n", " "), field) from None
    if len(found) > 1:
        raise BadRequest(f"{found[1][1]}: only one constraint may be given, and {found[0][1]} is already "
                         "set (drop one)", found[1][1])
    return found[0] if found else (None, None)


def compile_error(e: ValueError, field: str) -> BadRequest:
    """A grammar engine's ValueError ("structured_outputs.regex: ...") as a 400 naming `field`."""
    message = str(e).split(": ", 1)[-1] if str(e).startswith("structured_outputs") else str(e)
    return BadRequest(f"{field}: {message}", field)


def tool_calls(text: str, tool_choice, tools: list[dict]) -> list[dict]:
    """OpenAI's message.tool_calls from a constrained output: a named function's arguments, or the
    "required" array of {"name", "parameters"}. [] when the text does not parse (cut by max_tokens)."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if isinstance(tool_choice, dict):
        calls = [(tool_choice["function"]["name"], value)]
    else:
        calls = [(c["name"], c["parameters"]) for c in value]
    return [{"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
            for name, args in calls]


class ToolCallStream:
    """A streamed constrained tool call as OpenAI's `delta.tool_calls` (vLLM's shape): the first
    delta of a call carries index, id, type and function.name (arguments ""), later ones pieces of
    function.arguments, which concatenate to the call's arguments JSON text as generated (its
    whitespace kept). feed(text delta) -> the tool_calls entries it completes.

    A named function: the whole output is its arguments. "required": the output is the array of
    {"name", "parameters"} objects of tool_schema; a small scanner follows the JSON (strings,
    nesting) and sends a call's header once its name string is closed and its parameters' text
    as it arrives. The output is grammar-constrained, so it is JSON of that shape as far as it goes.
    """

    def __init__(self, tool_choice):
        self.name = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
        self.num_calls = 0
        self.depth, self.in_str, self.escape = 0, False, False
        self.expect_key, self.key, self.string = True, None, None     # at depth 2 (an item)
        self.args, self.in_args, self.header = "", False, None

    def _call(self, name: str) -> dict:
        self.num_calls += 1
        return {"index": self.num_calls - 1, "id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
                "function": {"name": name, "arguments": ""}}

    def feed(self, text: str) -> list[dict]:
        if self.name is not None:
            out = [self._call(self.name)] if not self.num_calls else []
            return out + ([{"index": 0, "function": {"arguments": text}}] if text else [])
        out = []
        for ch in text:
            out += self._char(ch)
        return out + self._flush()

    def _flush(self) -> list[dict]:
        """The current call's arguments text not sent yet, once its header is sent."""
        if not self.args or self.header is None:
            return []
        args, self.args = self.args, ""
        return [{"index": self.header, "function": {"arguments": args}}]

    def _char(self, ch: str) -> list[dict]:
        """One character of the "required" array; -> the entries it completes."""
        if self.in_args and not self.in_str and self.depth == 2 and ch in ",}":
            self.in_args, self.key = False, None        # the parameters value ended before ch
            done = self._flush()
            return done + self._char(ch)
        if self.in_args:
            self.args += ch
        elif self.depth == 2 and not self.in_str and self.key == "parameters" and not ch.isspace() \
                and ch != ":":
            self.in_args, self.args = True, ch
        out = []
        if self.in_str:
            if self.string is not None:
                self.string += ch
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_str = False
                out = self._string_closed()
        elif ch == '"':
            self.in_str, self.string = True, '"' if self.depth == 2 and not self.in_args else None
        elif ch in "[{":
            self.depth += 1
            if self.depth == 2:
                self.expect_key, self.key, self.header = True, None, None
        elif ch in "]}":
            self.depth -= 1
        elif self.depth == 2 and ch == ",":
            self.expect_key = True
        elif self.depth == 2 and ch == ":":
            self.expect_key = False
        return out

    def _string_closed(self) -> list[dict]:
        if self.string is None:
            return []
        value, self.string = json.loads(self.string), None
        if self.expect_key:
            self.key = value
            return []
        if self.key == "name" and self.header is None:
            call = self._call(value)
            self.header = call["index"]
            return [call, *self._flush()]
        return []

    def choice(self, choice: dict, delta: str, finished: bool, tool_choice) -> dict:
        """The streamed chat `choice` with its content delta as tool_calls deltas; finish_reason
        "tool_calls" for "required" (as the non-streamed response)."""
        calls = self.feed(delta or "")
        choice["delta"] = {"tool_calls": calls} if calls else {}
        if finished and tool_choice == "required" and self.num_calls:
            choice["finish_reason"] = "tool_calls"
        return choice
