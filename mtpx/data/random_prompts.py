"""Random token-id prompts of a given length, as vLLM bench's ``random`` dataset.

Each prompt is ``input_len`` token ids drawn uniformly from the vocabulary without the special
tokens (end-of-text, padding, chat markers: their ids would end or restructure a prompt), from
numpy's generator seeded with ``seed``: the same arguments give the same prompts. They are given
to the engine as ids (no detokenize / re-tokenize round trip, so the lengths are exact), and
each is decoded for exactly ``output_len`` tokens with ``ignore_eos``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["special_token_ids", "random_token_ids"]


def special_token_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special added tokens and its eos ids (empty for None)."""
    if tokenizer is None:
        return set()
    ids = {i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
    return ids | set(getattr(tokenizer, "eos_token_ids", None) or ())


def random_token_ids(num_prompts: int, input_len: int, vocab_size: int, seed: int,
                     exclude: Iterable[int] = ()) -> list[list[int]]:
    """``num_prompts`` lists of ``input_len`` ids in ``[0, vocab_size)`` minus ``exclude``.

    Raises:
        ValueError: a count < 1, or no id left to draw from.
    """
    if num_prompts < 1 or input_len < 1:
        raise ValueError(f"random_token_ids: num_prompts={num_prompts}, input_len={input_len}: "
                         "both must be >= 1")
    allowed = np.setdiff1d(np.arange(vocab_size), np.fromiter(exclude, dtype=np.int64))
    if allowed.size == 0:
        raise ValueError(f"random prompts: no token id left in a vocabulary of {vocab_size} "
                         "once the special tokens are taken out")
    rng = np.random.default_rng(seed)
    return rng.choice(allowed, size=(num_prompts, input_len)).tolist()
