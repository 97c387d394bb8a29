"""Stop strings (vLLM's `SamplingParams.stop`): find the first stop string in a request's output
text as tokens arrive, looking only at the tail that a new token can complete."""
from __future__ import annotations

from typing import Callable, Sequence


class StopStrings:
    """stop: the strings; decode(ids) -> str: the tokenizer's decoding of output token ids.

    `check(output_token_ids)` after each appended token returns the stop string the output text
    now contains, or None. It decodes only the last 4 x len(longest stop) + 2 tokens: every token
    decodes to at least one byte and a character is at most 4 bytes, so a stop string that the
    newest token completes lies inside that window. Checking after every token finds the token
    that completes the first match, so speculative and plain decoding stop at the same token.
    """

    def __init__(self, stop: Sequence[str], decode: Callable[[list[int]], str]):
        self.stop = list(stop)
        self.decode = decode
        self.window = 4 * max(len(s) for s in self.stop) + 2

    def check(self, output_token_ids: list[int]) -> str | None:
        tail = self.decode(output_token_ids[-self.window:])
        return next((s for s in self.stop if s in tail), None)



def cut_at_stop(text: str, matched: str) -> str:
    """The output text as returned after stop string `matched` ended it: everything before its
    first occurrence (vLLM's default, include_stop_str_in_output=False)."""
    at = text.find(matched)
    return text if at < 0 else text[:at]
