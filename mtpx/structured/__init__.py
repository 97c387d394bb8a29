"""Structured output: constraints compiled into grammars over the tokenizer's vocabulary and the
token masks that keep the target's logits inside them, exact under speculation
(docs/structured_output.md).

- grammar.py: GrammarCompiler, StructuredOutputsParams -> an xgrammar CompiledGrammar, cached.
- masks.py: GrammarMasks, the model runner's per-request matchers and the window masks.
- tools.py: OpenAI tool calling (`tools`, `tool_choice`) as a JSON-schema constraint, and the
  tool calls parsed back from the output.
"""
from mtpx.structured.grammar import GrammarCompiler
from mtpx.structured.masks import GrammarMasks

__all__ = ["GrammarCompiler", "GrammarMasks"]
