"""What the engine returns, in vLLM's shapes (vllm/outputs.py): `RequestOutput`, its
`CompletionOutput`s, `Logprob`s and `RequestMetrics`, and the speculative-decoding counters
`SpecDecodeCounts` a request carries (vLLM's definitions: mtpx.metrics.stats, whose benchmark
metrics are computed from these).

Plain dataclasses over the standard library: the scheduler side (mtpx.core.request) imports them
without torch, numpy, rich or omegaconf (tests/test_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SpecDecodeCounts", "Logprob", "CompletionOutput", "RequestMetrics", "RequestOutput"]


@dataclass
class SpecDecodeCounts:
    """One request's (or a whole run's) speculative-decoding counters.

    Attributes:
        num_drafts: verification rounds with >= 1 draft token.
        num_draft_tokens: draft tokens proposed in those rounds.
        num_accepted_tokens: draft tokens the verifier accepted (raw: accepted drafts after a stop
            token count; the bonus token does not).
        accepted_per_position: ``[i]`` = rounds whose i-th draft token was accepted (raw).
        num_committed_tokens: tokens those rounds appended to the output (accepted drafts up to a
            stop, plus the bonus token when it was emitted): the numerator of acceptance length.
        rounds: one ``(num_draft_tokens, num_accepted, num_committed)`` triple per round, in order
            (a request's own rounds; empty for an aggregate): the per-round record the acceptance
            analytics (mtpx.metrics.analytics) are computed from.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    rounds: list[tuple[int, int, int]] = field(default_factory=list)
    num_committed_tokens: int = 0

    @property
    def acceptance_length(self) -> float | None:
        """Mean acceptance length: committed tokens / num_drafts (module doc); None without drafts."""
        return self.num_committed_tokens / self.num_drafts if self.num_drafts else None

    def record_round(self, num_draft_tokens: int, num_accepted: int,
                     num_committed: int | None = None) -> None:
        """Record one verification round that proposed ``num_draft_tokens``, of which the verifier
        accepted ``num_accepted``, and that committed ``num_committed`` tokens to the output
        (default ``num_accepted + 1``: every accepted draft and the bonus token).

        Accepted drafts are a prefix of the proposal (positions ``0 .. num_accepted-1``), as in
        vLLM's rejection sampler. A round with 0 drafts records nothing.

        Raises:
            ValueError: a count is negative, more drafts are accepted than were proposed, or
                ``num_committed`` is not in ``[1, num_accepted + 1]``.
        """
        if num_committed is None:
            num_committed = num_accepted + 1
        args = f"record_round({num_draft_tokens}, {num_accepted}, {num_committed})"
        if num_draft_tokens < 0 or num_accepted < 0:
            raise ValueError(f"{args}: counts must be >= 0")
        if num_accepted > num_draft_tokens:
            raise ValueError(
                f"{args}: cannot accept more drafts than were proposed; pass the accepted draft "
                "tokens without the bonus token"
            )
        if not 1 <= num_committed <= num_accepted + 1:
            raise ValueError(f"{args}: a round commits between 1 and num_accepted + 1 tokens")
        if num_draft_tokens == 0:
            return
        self.rounds.append((num_draft_tokens, num_accepted, num_committed))
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        self.num_committed_tokens += num_committed
        if len(self.accepted_per_position) < num_accepted:
            self.accepted_per_position.extend([0] * (num_accepted - len(self.accepted_per_position)))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1


@dataclass
class Logprob:
    """vLLM's Logprob: a token's log-probability (natural log, target's raw logits), its rank
    among all tokens (1 = the most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion of a request, in vLLM's shape (``RequestOutput.outputs[0]``).

    Attributes:
        index: the completion's index within its request (0 .. SamplingParams.n - 1).
        text: decoded text, cut before a matched stop string.
        token_ids: generated token ids (the tokens of a matched stop string included, as vLLM).
        finish_reason: "stop" | "length" | "abort", or None when the request failed.
        stop_reason: the stop string or the stop token id from ``SamplingParams`` that ended it;
            None when it ended at the model's EOS, at a length limit, or not at all.
        spec: this completion's speculative-decoding counters.
        logprobs: with SamplingParams.logprobs, one dict per token of ``token_ids``: token id ->
            Logprob for the output token and the most likely ones (vLLM's shape); else None.
        cumulative_logprob: the sum of the output tokens' log-probabilities (with logprobs).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None = None
    spec: SpecDecodeCounts | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestMetrics:
    """vLLM's ``RequestOutput.metrics`` fields from what mtpx records, in ``time.perf_counter()``
    seconds (vLLM: ``time.time()``; differences are comparable): arrival_time, first_token_time,
    last_token_time (the last step that emitted tokens), finished_time; None where it never
    happened. first_scheduled_time, time_in_queue, scheduler_time, model_forward_time and
    model_execute_time are None: mtpx does not record them per request (the engine's step
    timings are per step)."""

    arrival_time: float
    last_token_time: float | None
    first_token_time: float | None
    finished_time: float | None
    first_scheduled_time: float | None = None
    time_in_queue: float | None = None
    scheduler_time: float | None = None
    model_forward_time: float | None = None
    model_execute_time: float | None = None


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns for one request.

    Times are ``time.perf_counter()`` seconds. ``arrival_time`` is when the request entered the
    engine (at its arrival, once the client's concurrency limit lets it in), so TTFT includes
    waiting for a batch slot, as a benchmark client measures it.

    Attributes:
        index: position in the input prompt list.
        prompt_token_ids: the prompt's token ids.
        output_token_ids: generated token ids.
        text: decoded output text.
        finish_reason: "stop" | "length" | "abort", or None when the request failed.
        spec: the request's speculative-decoding counters.
        arrival_time: seconds when the request entered the engine.
        first_token_time: seconds when the first output token was emitted, None if never.
        finish_time: seconds when the request finished, None if never.
        error: the failure message when the request failed; other requests still finish.
        logit_gaps: optional top-2 logit gap at each emitted token.
        num_cached_tokens: prompt tokens served by the prefix cache at first admission.
        num_preemptions: times the engine took its KV blocks back (it was recomputed).
        emission_times: seconds of each engine step that emitted tokens for it (several tokens
            accepted in one step are one emission), for ITL.
        prompt: the prompt text when the prompt was given as a string.
        stop_reason: see CompletionOutput.
        completions: every completion when SamplingParams.n > 1 (None: the one above).
        logprobs: see CompletionOutput.
        prompt_logprobs: with SamplingParams.prompt_logprobs, one entry per prompt token: None for
            the first, then the dict of CompletionOutput.logprobs for x_i given x_<i (vLLM's shape).
        outputs: ``[CompletionOutput]``, vLLM's view: ``completions``, or the one completion whose
            fields are above (with n > 1 the top-level fields and ``spec`` are completion 0's,
            each CompletionOutput has its own ``spec``).
    """

    index: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finish_reason: str | None
    spec: SpecDecodeCounts
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None
    error: str | None = None
    logit_gaps: list[float] | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    emission_times: list[float] = field(default_factory=list)
    prompt: str | None = None
    stop_reason: str | int | None = None
    completions: list[CompletionOutput] | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    @property
    def outputs(self) -> list[CompletionOutput]:
        if self.completions is not None:
            return self.completions
        cumulative = (sum(d[t].logprob for d, t in zip(self.logprobs, self.output_token_ids))
                      if self.logprobs is not None else None)
        return [CompletionOutput(0, self.text, self.output_token_ids, self.finish_reason, self.stop_reason,
                                 self.spec, self.logprobs, cumulative)]

    @property
    def request_id(self) -> str:
        return str(self.index)

    @property
    def metrics(self) -> RequestMetrics:
        """vLLM's RequestMetrics view of this request's times (RequestMetrics)."""
        last = self.emission_times[-1] if self.emission_times else None
        return RequestMetrics(self.arrival_time, last, self.first_token_time, self.finish_time)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
