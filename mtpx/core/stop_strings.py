"""Stop strings (vLLM's `SamplingParams.stop`): find the first stop string in a request's output
text as tokens arrive, looking only at the tail that a new token can complete."""
from __future__ import annotations

import os
from typing import Callable, Sequence


class StopStrings:
    """stop: the strings; decode(ids) -> str: the tokenizer's decoding of output token ids.

    `check(output_token_ids)` after each appended token returns the stop string the output text
    now contains, or None. It decodes a tail holding at least len(longest stop) + MARGIN
    characters (or the whole output): the last 4 x len(longest stop) + 2 tokens, reaching back
    further while they decode to fewer characters (tokens that decode to "", e.g. special tokens
    that decode skips). MARGIN covers what a cut inside a character or a stripped leading space
    garbles at the tail's start. `start`, where the last tail began, is where a short tail reaches
    back to first. Checking after every token finds the token that completes the first match, so
    speculative and plain decoding stop at the same token.
    """

    MARGIN = 4

    def __init__(self, stop: Sequence[str], decode: Callable[[list[int]], str]):
        self.stop = list(stop)
        self.decode = decode
        self.longest = max(len(s) for s in self.stop)
        self.window = 4 * self.longest + 2
        self.start = 0          # a tail from here held enough characters at the last check

    def check(self, output_token_ids: list[int], fresh: bool = False) -> str | None:
        """fresh: the tokens before the last one were never checked (the first check at
        params.min_tokens): only a stop string that ends in the last token's text counts, as in
        vLLM (a stop string before min_tokens does not end the request)."""
        ids, need = output_token_ids, self.longest + self.MARGIN
        n = len(ids)
        self.start = min(self.start, n)
        begin = max(self.start, n - self.window)
        tail = self.decode(ids[begin:])
        while len(tail) < need and begin > 0:
            floor = self.start if begin > self.start else 0     # self.start first: enough last time
            begin = max(floor, n - 2 * (n - begin))
            tail = self.decode(ids[begin:])
        if len(tail) >= need:
            self.start = begin
        if not fresh:
            return next((s for s in self.stop if s in tail), None)
        new_from = common_prefix_len(self.decode(ids[begin:n - 1]), tail)
        return next((s for s in self.stop if tail.find(s, max(0, new_from - len(s) + 1)) >= 0), None)


def common_prefix_len(a: str, b: str) -> int:
    """Characters at the start of `a` and `b` that agree."""
    return len(os.path.commonprefix([a, b]))


def stop_after(output_token_ids: list[int], min_tokens: int, text: str,
               decode: Callable[[list[int]], str]) -> int:
    """Characters of `text` (the decoding of output_token_ids by `decode`) that came before the
    min_tokens-th token: the stop string that ended the request ends after them (0 when
    min_tokens <= 1). One decode of min_tokens - 1 ids."""
    if min_tokens <= 1:
        return 0
    return common_prefix_len(decode(list(output_token_ids[:min_tokens - 1])), text)


def cut_at_stop(text: str, matched: str, include: bool = False, after: int = 0) -> str:
    """The output text as returned after stop string `matched` ended it: everything before its
    first occurrence that ends after character `after` (stop_after; 0: its first occurrence),
    vLLM's default, or up to its end with include (vLLM's include_stop_str_in_output=True)."""
    at = text.find(matched, max(0, after - len(matched) + 1))
    return text if at < 0 else text[:at + len(matched) * include]
