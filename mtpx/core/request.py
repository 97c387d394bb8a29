"""A request's mutable state inside the engine."""
from __future__ import annotations

from dataclasses import dataclass, field

from mtpx.core.sampling_params import SamplingParams
from mtpx.outputs import SpecDecodeCounts


@dataclass(eq=False)
class Request:
    """index: the request's id (its position in generate()'s prompt list).

    Engine bookkeeping (vLLM v1 names): num_computed_tokens: positions [0, n) whose target KV and
    recurrent state are final (the batch slot is the model runner's); draft_token_ids:
    proposed, not yet verified (their draft distributions, when sampled, are the model runner's);
    generator: the request's own random generator (seeded from params.seed) at temperature > 0;
    num_cached_tokens: prompt tokens served by the prefix cache at first admission; num_preemptions:
    times its blocks were taken back (it recomputes);
    draft_depth: the most drafts it proposes per step, set at its first admission and only
    lowered afterwards (mtpx/auto_k/policy.py, "Depth"); multi-module MTP keeps its draft
    modules 1..draft_depth exact and no others.
    stop_strings: the StopStrings checker of params.stop (None without stop strings); stop_reason:
    the stop string or stop token id (of params) that ended it.
    grammar: the compiled grammar of params.structured_outputs (an xgrammar CompiledGrammar, typed
    object: worker-owned, read only by the runner's grammar matchers, mtpx/structured/);
    bad_words_token_ids: params.bad_words as token-id sequences (mtpx/engine/logits.py bans them).
    Times (time.perf_counter() seconds): arrival_time when it entered the engine,
    first_token_time, finish_time; emission_times: one entry per step that emitted tokens
    (several accepted tokens in one step are one emission, for ITL); arrival_offset: seconds after
    the run starts at which the request arrives (request-rate benchmarks, 0 = at once).
    """

    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset = frozenset()
    output_token_ids: list[int] = field(default_factory=list)
    draft_token_ids: list[int] = field(default_factory=list)
    generator: object = None            # torch.Generator of a request with temperature > 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    admitted_once: bool = False
    draft_depth: int = 0
    spec: SpecDecodeCounts = field(default_factory=SpecDecodeCounts)
    logit_gaps: list[float] = field(default_factory=list)
    logprobs: list = field(default_factory=list)   # per output token: RequestResult.logprobs' entries
    prompt_logprobs: dict = field(default_factory=dict)  # prompt position i >= 1 -> the same entry for x_i
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    stop_strings: object = None         # mtpx.core.stop_strings.StopStrings, or None
    grammar: object = None              # compiled grammar of params.structured_outputs (worker-owned)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    error: str | None = None
    arrival_offset: float = 0.0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    emission_times: list[float] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt + output."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_prefilling(self) -> bool:
        """The target has not yet computed every known token but the last (a fresh request, a
        chunked prompt, or a request resumed after preemption)."""
        return self.num_computed_tokens < self.num_tokens - 1 or not self.output_token_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None
