"""Structured output: constraints compiled into grammars over the tokenizer's vocabulary and the
token masks that keep the target's logits inside them, exact under speculation
(docs/structured_output.md).

- grammar.py: GrammarCompiler, StructuredOutputsParams -> an xgrammar CompiledGrammar, cached.
- masks.py: GrammarMasks, the model runner's per-request matchers and the window masks.
(The server's tool calling is mtpx/serve/structured.py.) xgrammar loads on first use: import the
modules, not this package, for their names.
"""
