"""Tokenizer of a Hugging Face checkpoint folder, with its chat template.

A folder written by transformers' `save_pretrained` holds:

    tokenizer.json                      the fast (Rust) tokenizer: vocab, merges, added tokens   required
    tokenizer_config.json               special tokens (bos/eos/pad...), in older saves also     optional
                                        the chat template (a string, or a list of named ones)
    chat_template.jinja                 the chat template, in newer saves; wins over the above   optional
    additional_chat_templates/*.jinja   further named templates (e.g. "tool_use")                optional
    generation_config.json              eos_token_id (int or list): every id that ends a reply   optional

`load_hf_tokenizer(folder)` reads them into an `HFTokenizer`. It behaves like the plain
`tokenizers.Tokenizer` the rest of mtpx uses (`encode(text).ids`, `decode`, `get_vocab_size`,
`token_to_id` are passed through) and adds `apply_chat_template`, which renders a conversation
exactly as transformers' `apply_chat_template` does (transformers/utils/chat_template_utils.py and
tokenization_utils_base.py, v5): a jinja2 `ImmutableSandboxedEnvironment` with trim_blocks,
lstrip_blocks, loop controls and the `{% generation %}` tag, transformers' `tojson` /
`raise_exception` / `strftime_now`, and
the variables `messages`, `add_generation_prompt`, `tools`, `documents`, the named special tokens
(`bos_token`, `eos_token`, ...) and any extra keyword (`enable_thinking`, ...).

Security: a checkpoint folder is untrusted input. Nothing in it runs except the chat template, and
that only inside jinja2's sandbox; python files named by `auto_map` / `tokenizer_class` are ignored.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
GENERATION_CONFIG_FILE = "generation_config.json"
# The named special tokens transformers passes to every template
# (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                       "mask_token")
RESAVE_HINT = ("re-save the tokenizer with transformers: "
               "AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")
TEMPLATE_HINT = f"fix {CHAT_TEMPLATE_FILE} (or the chat_template entry of {TOKENIZER_CONFIG_FILE})"


class HFTokenizer:
    """A `tokenizers.Tokenizer` plus the special tokens and chat template of its checkpoint folder.

    Any attribute not defined here (`encode`, `decode`, `get_vocab_size`, `token_to_id`, ...) is
    looked up on the wrapped tokenizer, so an `HFTokenizer` can stand in wherever mtpx takes a
    plain `tokenizers.Tokenizer`.

    Args:
        backend_tokenizer: the fast tokenizer (from tokenizer.json); same name as transformers' attribute.
        chat_template: one jinja template, or a dict of named templates (as transformers keeps them;
            "default" is used unless `apply_chat_template` picks another), or None.
        special_tokens: named special tokens, e.g. {"eos_token": "<|im_end|>"}
            (keys from SPECIAL_TOKEN_NAMES).
        generation_config: the parsed generation_config.json; its `eos_token_id` (int or list) is added
            to `eos_token_ids`, its `bos_token_id` / `pad_token_id` fill in when no token string is named.
        source: where this came from (the folder), used in error messages.

    Attributes:
        chat_template (str | None): the default template. chat_templates (dict[str, str]): every named one.
        bos_token, eos_token, pad_token (str | None); bos_token_id, pad_token_id (int | None);
        eos_token_ids (list[int]): eos_token's id, then generation_config's, without repeats.

    Raises:
        ValueError: a named special token is not in the vocabulary, or an id in generation_config
            is not an int.
    """

    def __init__(self, backend_tokenizer: Tokenizer, chat_template: str | Mapping[str, str] | None = None, *,
                 special_tokens: Mapping[str, str] | None = None, generation_config: Mapping | None = None,
                 source: str = "<in memory>"):
        self.backend_tokenizer = backend_tokenizer
        self.source = source
        if isinstance(chat_template, Mapping):
            self.chat_templates = dict(chat_template)
        else:
            self.chat_templates = {} if chat_template is None else {"default": chat_template}
        self.chat_template = self.chat_templates.get("default")
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.bos_token = self.special_tokens.get("bos_token")
        self.eos_token = self.special_tokens.get("eos_token")
        self.pad_token = self.special_tokens.get("pad_token")
        gen = generation_config or {}
        gen_bos, gen_pad = _ids(gen, "bos_token_id", source), _ids(gen, "pad_token_id", source)
        self.bos_token_id = self._token_id("bos_token") if self.bos_token else next(iter(gen_bos), None)
        self.pad_token_id = self._token_id("pad_token") if self.pad_token else next(iter(gen_pad), None)
        eos = ([self._token_id("eos_token")] if self.eos_token else []) + _ids(gen, "eos_token_id", source)
        self.eos_token_ids = list(dict.fromkeys(eos))

    def __getattr__(self, name):
        # Only reached when normal lookup fails. Guard the wrapped object's own name (and dunders) so a
        # half-built instance (copy, pickle) raises AttributeError instead of recursing.
        if name == "backend_tokenizer" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.backend_tokenizer, name)

    def save(self, folder: str | os.PathLike) -> Path:
        """Write tokenizer.json, tokenizer_config.json (special tokens, chat templates) and
        generation_config.json (bos/eos/pad ids) into `folder`, so `load_hf_tokenizer(folder)`
        gives back an equal tokenizer (mtpx checkpoints trained from a Hugging Face model keep
        its tokenizer this way). Returns the tokenizer.json path. Raises OSError."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend_tokenizer.save(str(folder / TOKENIZER_FILE))
        write_tokenizer_config(folder, self)
        gen = {"bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_ids or None,
               "pad_token_id": self.pad_token_id}
        (folder / GENERATION_CONFIG_FILE).write_text(json.dumps({k: v for k, v in gen.items()
                                                                 if v is not None}) + "\n")
        return folder / TOKENIZER_FILE

    def __repr__(self) -> str:
        return (f"HFTokenizer(source={self.source!r}, vocab={self.backend_tokenizer.get_vocab_size()}, "
                f"eos_token_ids={self.eos_token_ids}, chat_templates={sorted(self.chat_templates)})")

    def _token_id(self, name: str) -> int:
        token = self.special_tokens[name]
        i = self.backend_tokenizer.token_to_id(token)
        if i is None:
            raise ValueError(f"{self.source}: {name} {token!r} (from {TOKENIZER_CONFIG_FILE}) is not in the "
                             f"vocabulary of {TOKENIZER_FILE}: fix {TOKENIZER_CONFIG_FILE} or {RESAVE_HINT}")
        return i

    def get_chat_template(self, chat_template: str | None = None, tools: list | None = None) -> str:
        """The template `apply_chat_template` renders, chosen as transformers' `get_chat_template` does.

        Args:
            chat_template: the name of one of `chat_templates`, or a literal jinja template, or None.
            tools: when given and there is a template named "tool_use", that one is the default.

        Returns:
            The jinja source: the named one, else `chat_template` itself, else "tool_use" (with tools),
            else the "default" template.

        Raises:
            ValueError: no template was given and the folder has no default one.
        """
        if chat_template is not None:
            return self.chat_templates.get(chat_template, chat_template)
        if tools is not None and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if self.chat_template is not None:
            return self.chat_template
        if self.chat_templates:
            raise ValueError(f"{self.source} has named chat templates {sorted(self.chat_templates)} but none "
                             f"is called 'default': pass chat_template=<name> to apply_chat_template")
        raise ValueError(f"{self.source} has no chat template: add a {CHAT_TEMPLATE_FILE} file (or a "
                         f"chat_template entry in {TOKENIZER_CONFIG_FILE}) to the folder, "
                         "or pass chat_template=<jinja source>")

    def apply_chat_template(self, messages: Sequence[Mapping], add_generation_prompt: bool = True,
                            tokenize: bool = False, *, chat_template: str | None = None,
                            tools: list | None = None, documents: list | None = None,
                            **kwargs) -> str | list[int]:
        """Render a conversation with the folder's chat template (transformers' `apply_chat_template` rules).

        Args:
            messages: one conversation, a list of dicts like {"role": "user", "content": "Hi"}; keys whose
                value is None are dropped first, as transformers does.
            add_generation_prompt: append the header that starts the assistant's reply. Note the default
                is True here (mtpx renders prompts to generate from); transformers' default is False.
            tokenize: return token ids instead of the string. The string is encoded with
                add_special_tokens=False, as transformers does: the template already holds every
                special token.
            chat_template: a template name (see `chat_templates`) or a literal jinja template;
                see `get_chat_template`.
            tools, documents: passed to the template (None when not given, as in transformers).
            **kwargs: further template variables (e.g. enable_thinking=False); they override the
                special tokens.

        Returns:
            The rendered prompt (str), or its token ids (list[int]) when tokenize=True.

        Raises:
            ValueError: empty conversation, no chat template, or a template that does not parse.
            TypeError: a message is not a dict.
            jinja2.exceptions.SecurityError: the template tried something the sandbox forbids
                (e.g. `__class__`).
            jinja2.exceptions.TemplateError: the template failed, e.g. its `raise_exception("...")` (the
                message is kept) or a filter got the wrong type (the original error is chained).
        """
        template = self.get_chat_template(chat_template, tools)
        if not messages:
            raise ValueError("cannot apply a chat template to an empty conversation: "
                             "pass at least one message")
        if not all(isinstance(m, Mapping) for m in messages):
            raise TypeError(f"messages must be dicts like {{'role': 'user', 'content': '...'}}, "
                            f"got {messages!r}")
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        variables = {**self.special_tokens, **kwargs}  # kwargs win, as in transformers
        compiled = _compile(template, self.source)
        try:
            text = compiled.render(messages=messages, tools=tools, documents=documents,
                                   add_generation_prompt=add_generation_prompt, **variables)
        except SecurityError as err:
            raise SecurityError(f"the chat template of {self.source} was stopped by the jinja2 sandbox "
                                f"({err}); mtpx only runs templates sandboxed: {TEMPLATE_HINT}") from err
        except TemplateError as err:  # raise_exception(...) in the template, or an undefined value misused
            raise TemplateError(f"the chat template of {self.source} raised: {err}") from err
        except Exception as err:  # e.g. a TypeError from a filter applied to the wrong kind of value
            raise TemplateError(
                f"the chat template of {self.source} failed: {type(err).__name__}: {err}") from err
        if tokenize:
            return self.backend_tokenizer.encode(text, add_special_tokens=False).ids
        return text


def load_hf_tokenizer(folder: str | os.PathLike) -> HFTokenizer:
    """Load the tokenizer, special tokens and chat template of a Hugging Face checkpoint folder.

    Reads tokenizer.json (required), tokenizer_config.json, chat_template.jinja,
    additional_chat_templates/*.jinja and generation_config.json (all optional), following transformers'
    precedence: template files, when present, replace any chat_template in tokenizer_config.json;
    tokenizer_config's chat_template may be a string or a list of {"name", "template"} (the one named
    "default" is used); special tokens may be strings or AddedToken dicts ({"content": ...}).
    `auto_map` / `tokenizer_class` are ignored: no python file from the folder is ever imported.

    Args:
        folder: the checkpoint folder.

    Returns:
        An `HFTokenizer`.

    Raises:
        FileNotFoundError: `folder` is not a folder, or has no tokenizer.json (e.g. only the slow-tokenizer
            files tokenizer.model or vocab.json + merges.txt); the message says how to write one.
        ValueError: a file is not valid JSON / not a valid tokenizer, has fields of the wrong type, or names
            a special token missing from the vocabulary; the message names the file and the fix.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: point at a Hugging Face checkpoint folder "
                                f"holding {TOKENIZER_FILE}")
    file = folder / TOKENIZER_FILE
    if not file.is_file():
        slow = [n for n in ("tokenizer.model", "vocab.json", "merges.txt", "vocab.txt")
                if (folder / n).is_file()]
        found = f"it only has the slow-tokenizer files {', '.join(slow)}; " if slow else ""
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {folder}: {found}mtpx reads only the fast "
                                f"tokenizer, so {RESAVE_HINT} (this writes {TOKENIZER_FILE})")
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception on a bad file
        raise ValueError(f"{file} is not a valid tokenizers file ({err}): {RESAVE_HINT}") from err
    config = _read_json(folder / TOKENIZER_CONFIG_FILE)
    special = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, Mapping):  # AddedToken saved as {"content": ..., "lstrip": ..., ...}
            value = value.get("content")
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{folder / TOKENIZER_CONFIG_FILE}: {name} must be a string or a dict with "
                             f"'content', got {value!r}: fix the file or {RESAVE_HINT}")
        special[name] = value
    return HFTokenizer(tok, _read_templates(folder, config), special_tokens=special,
                       generation_config=_read_json(folder / GENERATION_CONFIG_FILE), source=str(folder))


def _read_json(path: Path) -> dict:
    """The JSON object in `path`, or {} when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{path} is not valid JSON ({err}): fix the file, or re-save the checkpoint "
                         f"with transformers' save_pretrained") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}: fix the file")
    return data


def _read_templates(folder: Path, config: Mapping) -> dict[str, str]:
    """Named chat templates: the .jinja files if any (as transformers), else
    tokenizer_config's chat_template."""
    files = {}
    if (folder / CHAT_TEMPLATE_FILE).is_file():
        files["default"] = (folder / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    if (folder / CHAT_TEMPLATE_DIR).is_dir():
        for f in sorted((folder / CHAT_TEMPLATE_DIR).glob("*.jinja")):
            files[f.name.removesuffix(".jinja")] = f.read_text(encoding="utf-8")
    if files:
        return files
    t = config.get("chat_template")
    if t is None:
        return {}
    if isinstance(t, str):
        return {"default": t}
    if isinstance(t, list) and all(isinstance(e, Mapping) and isinstance(e.get("name"), str)
                                   and isinstance(e.get("template"), str) for e in t):
        return {e["name"]: e["template"] for e in t}
    raise ValueError(f"{folder / TOKENIZER_CONFIG_FILE}: chat_template must be a string or a list of "
                     f'{{"name": ..., "template": ...}}, got {str(t)[:80]!r}: fix it, or move the template '
                     f"into {CHAT_TEMPLATE_FILE}")


def _ids(config: Mapping, key: str, source: str) -> list[int]:
    """config[key] (an int, a list of ints, or absent) as a list."""
    value = config.get(key)
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{source}/{GENERATION_CONFIG_FILE}: {key} must be an int or a list of ints, "
                         f"got {value!r}: fix the file")
    return ids


# ---- rendering: transformers' chat-template environment (utils/chat_template_utils.py) ----

def _raise_exception(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Unlike jinja's own tojson: no HTML escaping, non-ASCII kept, and the json.dumps options exposed
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with it to build
    assistant-token masks. mtpx only needs the text, so the block renders its body, nothing else."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        # a call block, as in transformers, so variables set inside stay scoped the same way
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


@lru_cache(maxsize=None)
def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    if tuple(int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3]) < (3, 1, 6):
        # Older versions have known sandbox escapes, and chat templates are untrusted
        # (transformers checks the same)
        raise ImportError(f"chat templates need jinja2>=3.1.6, found {jinja2.__version__}: "
                          "pip install -U jinja2")
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=16)
def _compile(template: str, source: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except TemplateSyntaxError as err:
        raise ValueError(f"the chat template of {source} does not parse (line {err.lineno}: {err.message}): "
                         f"{TEMPLATE_HINT}") from err


# ---- mtpx's own tokenizer files (written by mtpx.train.tokenizer) ---------------------------------
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)  # ids 0 and 1, in this order


def tokenizer_config(tok) -> dict:
    """The tokenizer_config.json that makes transformers' AutoTokenizer load `tok`'s folder as
    this tokenizer (PreTrainedTokenizerFast over tokenizer.json: no Qwen2 / Llama pre-splitting
    guessed from config.json): the named special tokens and chat template(s) of an HFTokenizer,
    or `<|endoftext|>` (eos) and `<|pad|>` (pad) for mtpx's own tokenizer (a plain
    tokenizers.Tokenizer)."""
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if isinstance(tok, HFTokenizer):
        config |= tok.special_tokens
        if tok.chat_templates:
            config["chat_template"] = (tok.chat_template if list(tok.chat_templates) == ["default"] else
                                       [{"name": k, "template": v} for k, v in tok.chat_templates.items()])
    else:
        config |= {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    return config | {"model_max_length": None, "clean_up_tokenization_spaces": False}


def write_tokenizer_config(folder: str | os.PathLike, tok) -> Path:
    """Write `tokenizer_config(tok)` as `folder`/tokenizer_config.json. Returns its path. Raises OSError."""
    path = Path(folder) / TOKENIZER_CONFIG_FILE
    path.write_text(json.dumps(tokenizer_config(tok), indent=2, ensure_ascii=False) + "\n")
    return path


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer saved by `save_tokenizer` (a `tokenizer.json` file, or a folder holding one).

    Raises:
        FileNotFoundError: no tokenizer.json at `path`.
        ValueError: the file is not a tokenizer with `<|endoftext|>` = 0 and `<|pad|>` = 1.
    """
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no tokenizer at {file}: point at a checkpoint folder written by mode=train "
            f"(it holds {TOKENIZER_FILE})"
        )
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(
            f"{file} is not a valid tokenizers JSON file ({err}): re-save it with save_tokenizer") from err
    check_special_ids(tok, str(file))
    return tok


def check_special_ids(tok: Tokenizer, where: str) -> None:
    for want, token in enumerate(SPECIAL_TOKENS):
        got = tok.token_to_id(token)
        if got != want:
            raise ValueError(
                f"{where}: special token {token} has id {got}, expected {want}: "
                "use a tokenizer made by mtpx.train.tokenizer.train_tokenizer"
            )
