"""A request's output text as a stream of deltas whose concatenation is exactly the text a
non-streamed response returns (mtpx/serve/responses.py, mtpx/serve/runner.py).

While the request runs, the tail of the text that could still become a stop string is held back
(the longest suffix that is a proper prefix of one), and so is an incomplete UTF-8 character
(decoded as U+FFFD); once it finishes, the rest is sent, cut at the matched stop string.
"""
from __future__ import annotations

from collections.abc import Sequence


def final_text(text: str, stop_reason: str | int | None, include_stop: bool = False, after: int = 0) -> str:
    """The finished text: cut before the first occurrence of the matched stop string that ends
    after character `after` (mtpx.core.stop_strings.stop_after: a stop string before min_tokens
    does not count), after it with include_stop (vLLM's include_stop_str_in_output); unchanged for
    other endings."""
    if not isinstance(stop_reason, str):
        return text
    at = text.find(stop_reason, max(0, after - len(stop_reason) + 1))
    if at < 0:
        return text
    return text[: at + len(stop_reason)] if include_stop else text[:at]


def held_back(text: str, stop: Sequence[str]) -> int:
    """Characters at the end of `text` that may still be the start of a stop string: the longest
    suffix of `text` that is a proper prefix of one of `stop` (0 when none)."""
    best = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class IncrementalText:
    """stop: the request's stop strings; include_stop: keep the matched stop string in the text.

    `delta(text, finished, stop_reason)` with the decoded text of all output tokens so far
    returns what to send now. Deltas never repeat or retract text: each one extends what was
    sent, and their concatenation at the end is `final_text(text, stop_reason, include_stop)`."""

    def __init__(self, stop: Sequence[str] = (), include_stop: bool = False):
        self.stop, self.include_stop = list(stop), include_stop
        self.sent = 0          # characters sent so far

    def visible(self, text: str, finished: bool, stop_reason: str | int | None = None, after: int = 0) -> str:
        """The prefix of `text` that may be sent now (after: as final_text's)."""
        if finished:
            return final_text(text, stop_reason, self.include_stop, after)
        text = text.rstrip("\ufffd")
        return text[: len(text) - held_back(text, self.stop)]

    def delta(self, text: str, finished: bool, stop_reason: str | int | None = None, after: int = 0) -> str:
        shown = self.visible(text, finished, stop_reason, after)
        out = shown[self.sent:]
        self.sent = max(self.sent, len(shown))
        return out
