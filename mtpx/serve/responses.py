"""OpenAI response bodies of the HTTP API: choices, logprobs, usage, the `spec_decode` field and
server-sent events.

`Formatter` holds the served LLM (its tokenizer decodes output tokens); the functions here need
nothing of it. Every response carries `usage` and a `spec_decode` field (drafts, accepted, per
position, acceptance length); a stream's chunks carry the logprobs of their tokens, its last
chunk of a choice the stop reason and spec-decode counts, and with stream_options.include_usage
a usage chunk comes before `data: [DONE]`.
"""
from __future__ import annotations

import json
from typing import Any

from mtpx.core.stop_strings import stop_after
from mtpx.engine.llm import LLM
from mtpx.serve.async_engine import Update
from mtpx.serve.detokenize import final_text
from mtpx.serve.parsing import Run
from mtpx.serve.protocol import ChatRequest, CompletionRequest, SamplingFields


def sse(obj: dict) -> str:
    """One server-sent event holding `obj` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def sse_error(message: str | None) -> str:
    """The event that ends a stream whose request failed (HTTP status 200 is already sent)."""
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": 500}})


def spec_decode_stats(u: Update) -> dict[str, Any]:
    """The response's `spec_decode` field from a finished request's counters."""
    s = u.spec
    return {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens,
            "accepted_per_position": list(s.accepted_per_position),
            "num_committed_tokens": s.num_committed_tokens, "acceptance_length": s.acceptance_length}


def usage(prompt_len: int, completion_len: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_len, "completion_tokens": completion_len,
            "total_tokens": prompt_len + completion_len}


def total_usage(runs: list[Run], updates: list[Update]) -> dict[str, int]:
    """Usage of an HTTP request: each prompt counted once (not once per completion)."""
    return usage(sum(len(r.ids) for r in runs if r.first_of_prompt), sum(len(u.token_ids) for u in updates))


def continuous_usage(body: SamplingFields) -> bool:
    so = body.stream_options
    return bool(so is not None and so.include_usage and so.continuous_usage_stats)


def stream_chunk(base: dict, choice: dict, body: SamplingFields, run: Run, u: Update) -> dict:
    """One streamed chunk of `choice` (completions and chat alike): the stop reason and
    spec-decode counts on a finished choice, usage with continuous_usage_stats."""
    chunk = {**base, "choices": [choice]}
    if u.finished:
        choice["stop_reason"] = u.stop_reason
        chunk["spec_decode"] = spec_decode_stats(u)
    if continuous_usage(body):
        chunk["usage"] = usage(len(run.ids), len(u.token_ids))
    return chunk


def stream_end(base: dict, body: SamplingFields, runs: list[Run], last: dict[int, Update]) -> list[str]:
    """A stream's last events: the usage chunk (stream_options.include_usage), then [DONE]."""
    events = []
    so = body.stream_options
    if (so is not None and so.include_usage and len(last) == len(runs)
            and not any(u.error for u in last.values())):
        events.append(sse({**base, "choices": [], "usage": total_usage(runs, list(last.values()))}))
    return events + ["data: [DONE]\n\n"]


class Formatter:
    """Decodes `llm`'s output tokens into OpenAI's choices and logprobs."""

    def __init__(self, llm: LLM):
        self.llm, self.tok = llm, llm.tokenizer

    def output_text(self, run: Run, u: Update, body: SamplingFields) -> str:
        """All output tokens decoded so far; without skip_special_tokens a finishing stop token
        (EOS, stop_token_ids) is left out of the text, as vLLM does."""
        ids = u.token_ids
        if (not body.skip_special_tokens and u.finished and u.finish_reason == "stop"
                and not isinstance(u.stop_reason, str)):
            ids = ids[:-1]
        return self.decode(ids, body)

    def decode(self, ids, body: SamplingFields) -> str:
        if body.skip_special_tokens:
            return self.llm.decode(ids)
        return "" if self.tok is None else self.tok.decode(list(ids), skip_special_tokens=False)

    def stop_after(self, run: Run, u: Update, body: SamplingFields, text: str) -> int:
        """final_text's `after` for the output `text` of a finished run (stop_after)."""
        if not (u.finished and isinstance(u.stop_reason, str)):
            return 0
        return stop_after(u.token_ids, run.sp.min_tokens, text, lambda ids: self.decode(ids, body))

    def final_text(self, run: Run, u: Update, body: SamplingFields) -> str:
        """A finished run's text, cut at the stop string that ended it."""
        text = self.output_text(run, u, body)
        return final_text(text, u.stop_reason, body.include_stop_str_in_output,
                          self.stop_after(run, u, body, text))

    def token_str(self, t: int, as_ids: bool) -> str:
        return f"token_id:{t}" if as_ids else self.llm.decode([t])

    def logprobs_block(self, ids: list[int], entries: list, offset: int, as_ids: bool) -> dict:
        """OpenAI's completion logprobs of tokens `ids` with their entries (None: the first prompt
        token): tokens, token_logprobs, top_logprobs (the token and the top N, by text),
        text_offset (characters, from `offset`)."""
        tokens = [self.token_str(t, as_ids) for t in ids]
        token_lps, tops = [], []
        for t, e in zip(ids, entries):
            if e is None:
                token_lps.append(None)
                tops.append(None)
                continue
            lp, _, top = e
            token_lps.append(lp)
            tops.append({self.token_str(i, as_ids): v for i, v in top} | {self.token_str(t, as_ids): lp})
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    def prompt_logprobs_list(self, ids: list[int], scored: dict) -> list:
        """vLLM's prompt_logprobs: None for the first token, then {token id: {logprob, rank,
        decoded_token}} with the top tokens and the prompt token."""
        decode = self.llm.decode
        out: list = [None]
        for i in range(1, len(ids)):
            e = scored.get(i)
            if e is None:
                out.append(None)
                continue
            lp, rank, top = e
            d = {str(t): {"logprob": v, "rank": j + 1, "decoded_token": decode([t])}
                 for j, (t, v) in enumerate(top)}
            d[str(ids[i])] = {"logprob": lp, "rank": rank, "decoded_token": decode([ids[i]])}
            out.append(d)
        return out

    def completion_choice(self, run: Run, u: Update, body: CompletionRequest) -> dict:
        """A finished run's choice of a /v1/completions response (echo, logprobs and
        prompt_logprobs as the body asks)."""
        text = self.final_text(run, u, body)
        lp = None
        if u.logprobs is not None:
            entries, ids = list(u.logprobs), list(u.token_ids)
            if body.echo:
                scored = u.prompt_logprobs or {}
                entries = [None] + [scored.get(i) for i in range(1, len(run.ids))] + entries
                ids = list(run.ids) + ids
            lp = self.logprobs_block(ids, entries, 0, bool(body.return_tokens_as_token_ids))
        choice = {"index": run.index, "text": run.echo + text, "logprobs": lp,
                  "finish_reason": u.finish_reason, "stop_reason": u.stop_reason,
                  "spec_decode": spec_decode_stats(u)}
        if body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = self.prompt_logprobs_list(run.ids, u.prompt_logprobs or {})
        if body.return_token_ids:
            choice |= {"prompt_token_ids": run.ids, "token_ids": u.token_ids}
        return choice

    def chat_choice(self, run: Run, u: Update, body: ChatRequest) -> dict:
        """A finished run's choice of a /v1/chat/completions response."""
        text = self.final_text(run, u, body)
        choice = {"index": run.index, "message": {"role": "assistant", "content": text},
                  "finish_reason": u.finish_reason, "stop_reason": u.stop_reason}
        if body.return_token_ids:
            choice["token_ids"] = u.token_ids
        return choice
