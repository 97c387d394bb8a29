"""Per-request generation parameters (vLLM's `SamplingParams` names)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field


MAX_LOGPROBS = 20  # vLLM's default max_logprobs


@dataclass
class SamplingParams:
    """max_tokens: output tokens at most; temperature: 0 = greedy, else sample from
    softmax(logits / temperature) after top_k (keep the k most likely tokens; 0 or -1 = all),
    top_p (keep the smallest set whose probability reaches top_p; 1 = all) and min_p (drop tokens
    below min_p x the top probability; 0 = none), in that order, as vLLM applies them; seed: the
    request's own random generator (None: drawn from torch's global generator), so its output
    with a given seed does not depend on the other requests in the batch; stop_token_ids:
    generation ends after emitting one of these (the eos id is added unless ignore_eos); stop:
    strings that end generation once the output text contains one (the text is cut before it,
    the token ids keep it, as vLLM does; a str is one stop string); n: completions per prompt
    (LLM.generate runs completion j with seed + j, as vLLM's parallel sampling); logprobs:
    the log-probabilities of each output token and of the `logprobs` most likely tokens at its
    position (None: none; 0: the output token's only), from the target's raw logits (before
    temperature and top-k/p, vLLM's default "raw_logprobs"); prompt_logprobs: the same for each
    prompt token after the first (prompt scoring; such a request skips the prefix cache, so every
    position is computed); min_tokens: no EOS or stop_token_ids may be sampled (their logits are
    masked, drafts included) and no stop string ends the request before this many output tokens;
    include_stop_str_in_output: keep the stop string that ended the request in its text.
    Logits processing, as vLLM's sampler applies it to the target's logits before temperature
    (first logit_bias and the min_tokens mask, then the penalties): logit_bias: {token id: bias}
    added to those logits (OpenAI's logit_bias; the server clamps biases to [-100, 100] as vLLM
    does); repetition_penalty (> 0, 1 = none): a logit of a token that occurs in the prompt or the
    output so far is divided by it when positive, multiplied when not; frequency_penalty and
    presence_penalty (in [-2, 2], 0 = none): subtract penalty x (times the token occurs in the
    output so far) and penalty x (1 if it occurs in the output) (vLLM's apply_penalties). Each
    output token is processed with the output before it, also inside a speculative window (a
    draft position's logits count the drafts before it, which are exactly the tokens committed if
    it is reached), so greedy output with speculation equals plain decoding with the same
    penalties. logprobs stay those of the raw logits (vLLM's default "raw_logprobs").
    Raises ValueError, naming the field, on a value of the wrong type or out of range."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    stop: list[str] | str | None = None
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None

    def __post_init__(self):
        def integer(value):
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        for key in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                    "repetition_penalty"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{key}={value!r}: must be a number, not {type(value).__name__} "
                                 f"(e.g. SamplingParams({key}=0.5))")
        for key in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, key) <= 2:
                raise ValueError(f"{key}={getattr(self, key)!r}: must be in [-2, 2] (0 = no penalty)")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty!r}: must be > 0 (1 = no penalty)")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                    integer(t) and t >= 0 and isinstance(v, numbers.Real) and not isinstance(v, bool)
                    and math.isfinite(v) for t, v in self.logit_bias.items()):
                raise ValueError(f"logit_bias={self.logit_bias!r}: must be a dict of token id (integer >= 0) "
                                 "-> finite bias, e.g. {50256: -100}")
            self.logit_bias = {int(t): float(v) for t, v in self.logit_bias.items()} or None
        if not isinstance(self.include_stop_str_in_output, bool):
            raise ValueError(f"include_stop_str_in_output={self.include_stop_str_in_output!r}: "
                             "must be True or False")
        if not integer(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r}: must be an integer >= 1")
        if self.seed is not None and not (integer(self.seed) and 0 <= self.seed < 2**64):
            raise ValueError(f"seed={self.seed!r}: must be an integer in [0, 2**64), or None")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise ValueError(f"stop={self.stop!r}: must be a string or a list of strings, e.g. stop=['\\n']")
        self.stop = list(self.stop or [])
        if not all(isinstance(x, str) and x for x in self.stop):
            raise ValueError(f"stop={self.stop!r}: must be a list of non-empty strings")
        if self.logprobs is not None and not (integer(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs={self.logprobs!r}: must be an integer in [0, {MAX_LOGPROBS}] "
                             "(top tokens per position besides the sampled one), or None")
        if self.prompt_logprobs is not None and not (integer(self.prompt_logprobs)
                                                     and 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise ValueError(f"prompt_logprobs={self.prompt_logprobs!r}: must be an integer in "
                             f"[0, {MAX_LOGPROBS}], or None")
        if not integer(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens!r}: must be an integer in "
                             f"[0, max_tokens={self.max_tokens}]")
        if not integer(self.n) or self.n < 1:
            raise ValueError(f"n={self.n!r}: must be an integer >= 1 (completions per prompt)")
        if not integer(self.top_k):
            raise ValueError(f"top_k={self.top_k!r}: must be an integer (0 or -1 = all tokens)")
        if not isinstance(self.stop_token_ids, (list, tuple, set, frozenset)) or not all(
                integer(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r}: must be a list of token ids "
                             "(integers >= 0), e.g. stop_token_ids=[2]")
        self.stop_token_ids = list(self.stop_token_ids)
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature={self.temperature}: must be a finite number >= 0 (0 = greedy)")
        if self.top_k < -1:
            raise ValueError(f"top_k={self.top_k}: must be >= 1, or 0 / -1 for all tokens")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1]")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p={self.min_p}: must be in [0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        """Any of repetition_penalty, frequency_penalty, presence_penalty away from neutral."""
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0
