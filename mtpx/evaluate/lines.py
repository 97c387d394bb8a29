"""What mode=eval and mode=bench print besides the report table: the error lines of failed
requests, the dead-draft-position warning, and the parts of the report title (client, data set,
prompt count, lengths, sampling)."""
from __future__ import annotations

import sys

from omegaconf import DictConfig

from mtpx.data.prompts import Prompt
from mtpx.core.sampling_params import SamplingParams
from mtpx.metrics.stats import RequestOutput


def dead_position_warning(spec, min_tries: int = 20, rounds=None) -> str | None:
    """A line when some draft position accepted nothing in at least `min_tries` rounds that reached
    it (the previous position was accepted, and the round drafted that far: `rounds`, the
    (num_draft_tokens, num_accepted, ...) records of every request, counts it; without them every
    round is assumed to draft all positions), the sign of a broken draft module (NaN weights, a
    module trained for another target); None otherwise."""
    counts = spec.accepted_per_position
    for i in range(1, len(counts)):
        reached = counts[i - 1] if rounds is None else sum(1 for r in rounds if r[0] > i and r[1] >= i)
        if reached >= min_tries and counts[i] == 0:
            return (f"warning: draft position {i} (counted from 0, as in per_position_acceptance and the "
                    f"figures) accepted 0 of the {reached} drafts that reached it (position {i - 1} accepted "
                    f"them): check the weights of the module that drafts it "
                    f"(mtp.{i} with one module per position)")
    return None


def _print_request_errors(outs: list[RequestOutput]) -> None:
    for o in outs:
        if o.error:
            print(f"error: request {o.index}: {o.error}", file=sys.stderr)


def _all_failed(outs: list[RequestOutput], what: str = "") -> bool:
    """True (with one error line, `what` appended) when every request failed: the run's exit code
    is then 1."""
    if outs and all(o.error for o in outs):
        print(f"error: all {len(outs)} requests failed (the error lines above say why){what}",
              file=sys.stderr)
        return True
    return False


def _client_text(client: dict, c: DictConfig) -> list[str]:
    """The report title's client part: concurrency, and the request rate when arrivals are timed."""
    setup = [f"concurrency {client['max_concurrency'] or 'unlimited'}"]
    if client["arrival_offsets"] is not None:
        setup.append(f"{float(c.request_rate):g} req/s")
    return setup


def _count_text(n: int, total: int, skipped: int = 0) -> str:
    too_long = f" ({skipped} longer than max_model_len skipped)" if skipped else ""
    return (f"{n} prompts" if n == total else f"{n} of {total} prompts (interrupted)") + too_long


def _skip_long_prompts(prompts: list[Prompt], encode, max_model_len: int,
                       mode: str) -> tuple[list[Prompt], int]:
    """mode=bench: the prompts that fit max_model_len (the engine fails a prompt of max_model_len
    tokens or more) and how many were skipped, with one line saying so, as vLLM's benchmarks
    filter prompts too long for the model (metrics.json: num_prompts_skipped). encode(text) ->
    token ids. Other modes: unchanged (such a prompt fails alone)."""
    if mode != "bench":
        return prompts, 0
    fits = [p for p in prompts if len(p.engine_input if isinstance(p.engine_input, list)
                                      else encode(p.engine_input)) < max_model_len]
    skipped = len(prompts) - len(fits)
    if skipped == len(prompts):
        raise ValueError(f"bench: all {skipped} prompts have max_model_len={max_model_len} tokens or more: "
                         "raise engine.max_model_len (up to the model's max_position_embeddings) or use "
                         "another data set")
    if skipped:
        print(f"bench: skipped {skipped} of {len(prompts)} prompts of max_model_len={max_model_len} tokens "
              f"or more (engine.max_model_len); the other {len(fits)} run (metrics.json num_prompts_skipped)")
    return fits, skipped


def _check_fixed_lengths(prompts: list[Prompt], max_model_len: int) -> None:
    """Prompts with a fixed output length (data=random) must fit the model with all of it;
    ValueError naming data.input_len / data.output_len otherwise."""
    p = next((p for p in prompts if p.output_len is not None), None)
    if p is not None and len(p.engine_input) + p.output_len > max_model_len:
        raise ValueError(f"data.input_len={len(p.engine_input)} + data.output_len={p.output_len} "
                         f"exceed the model's maximum length {max_model_len} (engine.max_model_len, "
                         "default max_position_embeddings): lower them")


def _data_text(name: str, prompts: list[Prompt], chat: bool | None) -> str:
    """The data set in the report title: "mt_bench (chat template)", "random (input_len 64)"."""
    if chat is not None:
        return f"{name} ({'chat template' if chat else 'raw text, no chat template'})"
    if prompts[0].output_len is not None:
        return f"{name} (input_len {len(prompts[0].engine_input)})"
    return name


def _length_text(prompts: list[Prompt], max_tokens: int, cap: int | None = None) -> str:
    """"max_tokens 128", "max_tokens 100000 capped to 1017 by max_model_len 1024" (cap: the most
    output tokens any request can have, cap_max_tokens), or "output_len 32 (ignore_eos)" for
    fixed-length prompts."""
    if prompts[0].output_len is not None:
        return f"output_len {prompts[0].output_len} (ignore_eos)"
    return f"max_tokens {max_tokens}" + (f" (capped to {cap} by max_model_len)" if cap is not None else "")


def _sampling_text(p: SamplingParams) -> str:
    """"temperature 1, top_k 50, top_p 0.9": the temperature, then the filters that are set."""
    parts = [f"temperature {p.temperature:g}"]
    if p.top_k not in (0, -1):
        parts.append(f"top_k {p.top_k}")
    if p.top_p != 1.0:
        parts.append(f"top_p {p.top_p:g}")
    if p.min_p != 0.0:
        parts.append(f"min_p {p.min_p:g}")
    return ", ".join(parts)
