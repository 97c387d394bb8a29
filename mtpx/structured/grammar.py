"""Compiling a request's StructuredOutputsParams into a grammar over the tokenizer's vocabulary,
with xgrammar (https://github.com/mlc-ai/xgrammar, the default backend of vLLM and SGLang;
docs/structured_output.md says why).

`GrammarCompiler(tokenizer, vocab_size, stop_token_ids)` builds xgrammar's TokenizerInfo once from
a `tokenizers.Tokenizer` or mtpx's HFTokenizer (the vocabulary in id order and how its strings
encode bytes, read from tokenizer.json's decoder) and compiles each constraint once: compiled
grammars are cached per compiler (one per tokenizer) and constraint key
(StructuredOutputsParams.key), and xgrammar caches its own intermediate results.
"""
from __future__ import annotations

import json
import threading

import xgrammar as xgr

from mtpx.core.structured_outputs import StructuredOutputsParams

# whitespace characters allowed at each place JSON allows whitespace: a small model that loops on
# spaces or newlines inside an object otherwise runs to max_tokens (and its JSON is cut)
MAX_WHITESPACE = 4
CACHE_SIZE = 256          # compiled grammars kept per tokenizer (least recently used dropped)


def tokenizer_info(tokenizer, vocab_size: int, stop_token_ids: list[int]) -> xgr.TokenizerInfo:
    """xgrammar's TokenizerInfo of a tokenizers.Tokenizer (or anything passing its `get_vocab` and
    `to_str` through, as HFTokenizer): vocabulary strings in id order, padded to vocab_size (the
    model's logits width), and the vocab type from the decoder (ByteLevel: GPT-2 byte strings;
    ByteFallback: <0xNN> tokens with "▁" spaces; else raw strings), as xgrammar's
    TokenizerInfo.from_huggingface detects them."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    encoded = [""] * max(vocab_size, max(vocab.values()) + 1)
    for text, i in vocab.items():
        encoded[i] = text
    decoder = json.dumps(json.loads(tokenizer.to_str()).get("decoder"))
    if '"ByteLevel"' in decoder:
        vocab_type, prefix = xgr.VocabType.BYTE_LEVEL, False
    elif '"ByteFallback"' in decoder:
        vocab_type, prefix = xgr.VocabType.BYTE_FALLBACK, '"Strip"' in decoder
    else:
        vocab_type, prefix = xgr.VocabType.RAW, False
    return xgr.TokenizerInfo(encoded, vocab_type, vocab_size=vocab_size, stop_token_ids=stop_token_ids,
                             add_prefix_space=prefix)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose root is exactly one of `choices` (vLLM's choice_as_grammar)."""
    def escape(s: str) -> str:
        return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return "root ::= " + " | ".join(f'"{escape(c)}"' for c in choices)


# xgrammar 0.2.9 writes a string with minLength / maxLength as a run of _BOUNDED_CHAR: raw control
# characters, which JSON forbids in strings (RFC 8259 section 7; json.loads rejects them), pass.
# Its unbounded strings exclude them; bounded ones get the same class.
_BOUNDED_CHAR = r'[^\"\\\r\n]'
_JSON_CHAR = r'[^\0-\x1f\"\\]'


def json_grammar(schema: dict | str, any_whitespace: bool) -> xgr.Grammar:
    """xgrammar's grammar of a JSON schema, at most MAX_WHITESPACE whitespace characters wherever
    JSON allows whitespace, and bounded strings without raw control characters (above)."""
    g = xgr.Grammar.from_json_schema(schema if isinstance(schema, str) else json.dumps(schema),
                                     any_whitespace=any_whitespace, max_whitespace_cnt=MAX_WHITESPACE)
    return xgr.Grammar.from_ebnf(str(g).replace(_BOUNDED_CHAR, _JSON_CHAR))


class GrammarCompiler:
    """Compiles StructuredOutputsParams for one tokenizer (module doc); thread-safe.

    compile(params) -> xgrammar CompiledGrammar. Raises ValueError, one line naming the field
    (`structured_outputs.regex: ...`), for an invalid schema, regex or grammar, or a constraint no
    token of the vocabulary can start."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        self.info = tokenizer_info(tokenizer, vocab_size, list(stop_token_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._cache: dict[tuple, object] = {}
        self._lock = threading.Lock()
        self.num_compiled = 0

    def compile(self, params: StructuredOutputsParams):
        key = params.key
        with self._lock:
            hit = self._cache.pop(key, None)
            if hit is None:
                hit = self._compile(params)
                self.num_compiled += 1
                self._check_start(hit, params.kind)
            self._cache[key] = hit                              # most recently used last
            if len(self._cache) > CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            return hit

    def _compile(self, p: StructuredOutputsParams):
        kind, c = p.kind, self.compiler
        try:
            if kind in ("json", "json_object"):        # json_object: vLLM's any object, not any value
                schema = p.json if kind == "json" else {"type": "object"}
                return c.compile_grammar(json_grammar(schema, not p.disable_any_whitespace))
            if kind == "regex":
                return c.compile_regex(p.regex)
            if kind == "choice":
                return c.compile_grammar(choice_grammar(list(p.choice)))
            if "::=" in p.grammar:
                return c.compile_grammar(p.grammar)
            return c.compile_grammar(xgr.Grammar.from_lark(p.grammar))
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"structured_outputs.{kind}: {_first_line(e)}") from None

    def _check_start(self, compiled, kind: str) -> None:
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, self.info.vocab_size)
        matcher.fill_next_token_bitmask(mask)
        if not matcher.is_terminated() and not bool((mask != 0).any()):
            raise ValueError(f"structured_outputs.{kind}: no token of the tokenizer's vocabulary can "
                             "start an output that matches it")


def _first_line(e: Exception) -> str:
    """xgrammar's message without its C++ source location: '[time] file.cc:N: message'."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()] or [type(e).__name__]
    text = lines[0]
    if text.startswith("[") and ": " in text:
        text = text.split(": ", 1)[1]
    return text[:300]
