"""Byte-level BPE tokenizer, trained with Hugging Face `tokenizers` (the GPT-2 / Qwen recipe).

Byte-level means every string is encodable (no unknown token): text is mapped to its UTF-8 bytes,
each byte to one of 256 printable symbols, and BPE merges are learned on top. Two special tokens
come first so their ids are fixed whatever the corpus:

    <|endoftext|>  id 0   ends every document when the corpus is packed; generation stops on it
    <|pad|>        id 1   fills batches of unequal prompts (never trained on)

The tokenizer is a plain `tokenizers.Tokenizer`; the helpers below (`encode`, `decode`,
`eos_token_id`, `pad_token_id`) keep the calling code short and the special-token rules in one place.
It is saved as a single `tokenizer.json` that HF `transformers` can also read.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mtpx.hf.tokenizer import (EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, TOKENIZER_FILE,  # noqa: F401
                               check_special_ids, load_tokenizer)

# 256 byte symbols + the special tokens: the smallest vocabulary a byte-level BPE can have
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer on `texts`.

    Args:
        texts: the training documents (any iterable of str; consumed once).
        vocab_size: target vocabulary size including the 256 byte symbols and the 2 special tokens.
            A small corpus may yield fewer merges; read the real size with `tok.get_vocab_size()`.

    Returns:
        A `tokenizers.Tokenizer` with `<|endoftext|>` = id 0 and `<|pad|>` = id 1.

    Raises:
        ValueError: vocab_size is below 258 (256 bytes + 2 special tokens).
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"tokenizer vocab_size={vocab_size} is too small: a byte-level BPE needs at least "
            f"{MIN_VOCAB_SIZE} (256 bytes + {len(SPECIAL_TOKENS)} special tokens); "
            "raise train.tokenizer_vocab_size"
        )
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: "Answer:" and " Answer:" stay different, so prompts round-trip exactly
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),  # added first, so they get ids 0 and 1
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, even unseen ones
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    check_special_ids(tok, "the freshly trained tokenizer")
    return tok


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> Path:
    """Write `tok` as JSON. `path` is a folder (gets `tokenizer.json`) or a `.json` file path.

    Returns the file written.
    """
    path = Path(path)
    file = path if path.suffix == ".json" else path / TOKENIZER_FILE
    file.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(file))
    return file


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of `text`. Nothing is added around it; a literal `<|endoftext|>` inside it maps to id 0."""
    return tok.encode(text, add_special_tokens=False).ids


def encode_batch(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """`encode` for many texts at once (the Rust side runs them in parallel)."""
    return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def decode(tok: Tokenizer, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of token ids. By default `<|endoftext|>` and `<|pad|>` are dropped from the output."""
    return tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def eos_token_id(tok: Tokenizer) -> int:
    """Id of `<|endoftext|>` (0 for tokenizers made here); for a Hugging Face checkpoint's
    tokenizer (`mtpx.hf.tokenizer.HFTokenizer`), its first eos token."""
    if getattr(tok, "eos_token_ids", None):
        return tok.eos_token_ids[0]
    return _special_id(tok, EOS_TOKEN)


def pad_token_id(tok: Tokenizer) -> int:
    """Id of `<|pad|>` (1 for tokenizers made here)."""
    return _special_id(tok, PAD_TOKEN)


def _special_id(tok: Tokenizer, token: str) -> int:
    i = tok.token_to_id(token)
    if i is None:
        raise ValueError(f"tokenizer has no {token} token: use a tokenizer made by "
                         "mtpx.train.tokenizer.train_tokenizer")
    return i


def tokenizer_sha256(tok) -> str:
    """SHA-256 of a tokenizer's serialized form (`tokenizers.Tokenizer.to_str()`; a Hugging Face
    checkpoint's tokenizer by its backend): equal hashes encode and decode alike."""
    backend = getattr(tok, "backend_tokenizer", tok)
    return hashlib.sha256(backend.to_str().encode()).hexdigest()
