"""Request bodies (mtpx/serve/protocol.py) to engine runs: the checks a route makes before
anything runs, tokenization and chat templating, and SamplingParams.

`RequestParser` holds what the checks need of the served model (its name, tokenizer and
max_model_len); every check raises `BadRequest` (mtpx/serve/errors.py) with a one-line message
naming the field. Tokenization runs off the event loop (the routes call `prepare_completion` /
`prepare_chat` / `encode` / `chat_ids` through asyncio.to_thread), and a text certainly longer
than the model (more UTF-8 bytes than 4 x the longest token's x max_model_len) is refused before
it is tokenized. `read_body` parses a body (Content-Type application/json only, as vLLM) with
pydantic, off the event loop when it is large.
"""
from __future__ import annotations

import dataclasses
import json
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from mtpx.engine.llm import LLM
from mtpx.core.sampling_params import SamplingParams
from mtpx.serve.errors import BadRequest
from mtpx.serve.structured import compile_error, constraint
from mtpx.serve.protocol import (Body, ChatMessage, ChatRequest, CompletionRequest, SamplingFields,
                                 TokenizeRequest, unsupported_field)

B = TypeVar("B", bound=Body)
# bodies from this size on are parsed in a worker thread; smaller ones parse faster than a hand-off
OFF_LOOP_BYTES = 64 * 1024


def _int(text: str) -> int:
    return int(text)


def parse_large(raw: bytes, model: type[B]) -> B:
    """`raw` as `model`, for a worker thread: json.loads (and pydantic alone) hold the GIL for a
    whole parse, which stalls the event loop as much in a thread as on it; json.loads with a
    Python-level parse_int lets the interpreter hand the GIL over every few milliseconds (about
    2x slower). Only pydantic's validation (about 40 ns per token id) still holds it."""
    try:
        data = json.loads(raw, parse_int=_int)
    except ValueError as e:               # JSONDecodeError (with its line and column), UnicodeDecodeError
        why = str(e)
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": why, "input": None,
                                       "ctx": {"error": why}}]) from None
    return model.model_validate(data)


async def read_body(request: Request, model: type[B]) -> B:
    """The request's JSON body as `model`, parsed in a worker thread when it has OFF_LOOP_BYTES
    or more (parse_large). BadRequest (400) unless its Content-Type is application/json (vLLM's
    validate_json_request); RequestValidationError (a 400 naming the field,
    errors.validation_error) when pydantic refuses it."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise BadRequest(f"Content-Type is {media or 'missing'}: only application/json bodies are accepted "
                         "(send the header Content-Type: application/json)", "Content-Type")
    raw = await request.body()
    if not raw.strip():
        raise BadRequest("the request body is empty: send a JSON object", None)
    try:
        if len(raw) >= OFF_LOOP_BYTES:
            return await anyio.to_thread.run_sync(parse_large, raw, model)
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])}
                                      for err in e.errors(include_url=False)]) from None


@dataclasses.dataclass
class Run:
    """One engine request of an HTTP request: choice `index`, prompt ids, its params, the text
    echoed before its output ("" without echo) and whether it is its prompt's first completion."""
    index: int
    ids: list[int]
    sp: SamplingParams
    echo: str = ""
    first_of_prompt: bool = True
    arrival_time: float | None = None     # perf_counter() when the HTTP request arrived
    echo_only: bool = False               # max_tokens=0 with echo: its one output token is dropped


def _or(value, default):
    return default if value is None else value


def logit_bias(body: SamplingFields) -> dict[int, float] | None:
    """OpenAI's logit_bias ({"token id": bias}) as token ids; a bias outside [-100, 100] is a
    BadRequest, as OpenAI's API answers (vLLM clamps it)."""
    if not body.logit_bias:
        return None
    bad = [k for k in body.logit_bias if not k.strip().isdigit()]
    if bad:
        raise BadRequest(f"logit_bias key {bad[0]!r} is not a token id: keys are token ids such as "
                         "\"50256\" (POST /tokenize gives them)", "logit_bias")
    out = {k: v for k, v in body.logit_bias.items() if not -100 <= v <= 100}
    if out:
        k, v = next(iter(out.items()))
        raise BadRequest(f"logit_bias[{k!r}]={v}: a bias must be in [-100, 100] (-100 bans the token, "
                         "100 forces it)", "logit_bias")
    return {int(k): float(v) for k, v in body.logit_bias.items()}


def sampling(body: SamplingFields, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """The body's SamplingParams (OpenAI's defaults for unset fields); BadRequest naming the field
    SamplingParams refuses."""
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=_or(body.temperature, 1.0),
                              top_p=_or(body.top_p, 1.0), top_k=_or(body.top_k, -1),
                              min_p=_or(body.min_p, 0.0), seed=body.seed, stop=body.stop,
                              stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
                              logprobs=logprobs, min_tokens=body.min_tokens,
                              repetition_penalty=_or(body.repetition_penalty, 1.0),
                              frequency_penalty=_or(body.frequency_penalty, 0.0),
                              presence_penalty=_or(body.presence_penalty, 0.0),
                              logit_bias=logit_bias(body), structured_outputs=constraint(body)[0],
                              allowed_token_ids=body.allowed_token_ids,
                              bad_words=getattr(body, "bad_words", None))
    except ValueError as e:
        message = str(e)
        raise BadRequest(message,
                         message.split("=", 1)[0] if "=" in message.split(":")[0] else None) from None


class RequestParser:
    """The checks and tokenization of requests for `llm` served as `model_name`."""

    def __init__(self, llm: LLM, model_name: str):
        self.llm, self.model_name, self.tok = llm, model_name, llm.tokenizer
        tok = self.tok
        # the most bytes of text one token stands for (special tokens included), for check_size
        self.max_token_bytes = 1 if tok is None else max(
            len(tok.decode([i], skip_special_tokens=False).encode("utf-8"))
            for i in range(tok.get_vocab_size()))

    # ---- checks on the event loop, before tokenizing ----------------------------------------------
    def check_model(self, name: str | None) -> None:
        """A model other than the served one: 404 with code model_not_found (OpenAI's and vLLM's)."""
        if name is not None and name != self.model_name:
            raise BadRequest(f"The model '{name}' does not exist: this server serves '{self.model_name}' "
                             "(GET /v1/models)", "model", 404, "model_not_found")

    def check_fields(self, body: SamplingFields) -> None:
        """The model name and every field mtpx cannot honour (protocol.unsupported_field)."""
        self.check_model(body.model)
        bad = unsupported_field(body)
        if bad:
            raise BadRequest(*bad)
        if body.stream_options is not None and not body.stream:
            raise BadRequest("stream_options can only be given with stream=true (vLLM's and OpenAI's rule)",
                             "stream_options")

    def check_completion(self, body: CompletionRequest) -> None:
        self.check_fields(body)
        if body.stream and body.echo and body.logprobs is not None:
            raise BadRequest("echo with logprobs (prompt scoring) is not streamed: set stream=false",
                             "stream")
        if body.stream and body.prompt_logprobs is not None:
            raise BadRequest("prompt_logprobs are not streamed: set stream=false", "prompt_logprobs")
        if body.max_tokens == 0 and not body.echo:
            raise BadRequest("max_tokens=0 asks for no output: give max_tokens >= 1, or echo=true (with "
                             "logprobs) to score the prompt", "max_tokens")
        if body.max_tokens == 0 and body.stream:
            raise BadRequest("echo with max_tokens=0 (prompt scoring) is not streamed: set stream=false",
                             "stream")

    def check_chat(self, body: ChatRequest) -> None:
        self.check_fields(body)
        if body.logprobs:
            raise BadRequest("/v1/chat/completions does not return logprobs yet: use /v1/completions with "
                             "logprobs", "logprobs")
        if body.top_logprobs:
            raise BadRequest("top_logprobs needs logprobs, which /v1/chat/completions does not return yet",
                             "top_logprobs")
        if body.prompt_logprobs is not None:
            raise BadRequest("prompt_logprobs are returned by /v1/completions only (send the rendered "
                             "prompt)",
                             "prompt_logprobs")

    def check_tokenize(self, body: TokenizeRequest) -> None:
        self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise BadRequest("give exactly one of prompt or messages", "prompt")
        if body.continue_final_message:
            raise BadRequest("continue_final_message=True is not supported yet", "continue_final_message")
        if body.tools:
            raise BadRequest("tools are not supported yet (no tool calling): drop the field", "tools")

    # ---- tokenization (off the event loop) --------------------------------------------------------
    def check_size(self, text: str, param: str) -> None:
        """A text with more UTF-8 bytes than 4 x max_token_bytes x max_model_len holds more tokens
        than the model takes (with 4x room for normalizers): a 400 at once, not after tokenizing
        megabytes."""
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise BadRequest(f"{param} is not valid Unicode text", param) from None
        max_model_len = self.llm.max_model_len
        if size > 4 * self.max_token_bytes * max_model_len:
            raise BadRequest(f"{param} has {size} bytes of text, at least "
                             f"{size // (4 * self.max_token_bytes)} tokens, but the model's maximum length "
                             f"is {max_model_len} (max_model_len): "
                             "shorten it (or set truncate_prompt_tokens)", param)

    def encode(self, text: str, param: str, add_special_tokens: bool = True,
               truncates: bool = False) -> list[int]:
        """`text`'s token ids; truncates: the prompt will be cut to its last tokens (no size check)."""
        tok = self.tok
        if tok is None:
            raise BadRequest("this model has no tokenizer: send token ids", param)
        if not truncates:
            self.check_size(text, param)          # also raises for text that is not valid Unicode
        else:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{param} is not valid Unicode text", param) from None
        if len(text) > 4096:    # encode_batch releases the GIL (encode does not): the event loop runs on
            return list(tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        return list(tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def chat_ids(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                 add_special_tokens: bool = False, chat_template: str | None = None,
                 documents: list | None = None, kwargs: dict | None = None,
                 truncates: bool = False) -> list[int]:
        """The token ids of `messages` rendered with the chat template (the model's, or `chat_template`)."""
        tok = self.tok
        if tok is None or not hasattr(tok, "apply_chat_template") or (
                chat_template is None and getattr(tok, "chat_template", None) is None):
            raise BadRequest(f"model '{self.model_name}' has no chat template: use /v1/completions with a "
                             "plain prompt (or send chat_template)", "messages")
        try:
            rendered = tok.apply_chat_template([m.as_dict() for m in messages],
                                               add_generation_prompt=add_generation_prompt,
                                               chat_template=chat_template, documents=documents,
                                               **(kwargs or {}))
        except Exception as e:  # noqa: BLE001 - the template's own errors (raise_exception, bad roles)
            raise BadRequest(f"the chat template failed: {e}".replace("\n", " "), "messages") from None
        # the template holds the special tokens: encode without adding them (as transformers does)
        return self.encode(rendered, "messages", add_special_tokens, truncates)

    # ---- runs -------------------------------------------------------------------------------------
    def check_fits(self, ids: list[int], sp: SamplingParams, param: str) -> None:
        llm = self.llm
        error = llm.engine.validate_prompt(ids)
        if error:
            raise BadRequest(error, param)
        error = llm.engine.validate_params(sp)
        if error:
            raise BadRequest(error, error.split(" ", 1)[0])   # the key: logit_bias, stop_token_ids, ...
        if len(ids) + sp.max_tokens > llm.max_model_len:
            raise BadRequest(f"max_tokens={sp.max_tokens} with a {len(ids)}-token prompt exceeds the model's "
                             f"maximum length {llm.max_model_len}: lower max_tokens", "max_tokens")

    def runs_for(self, prompts_ids: list[list[int]], echoes: list[str], sp: SamplingParams,
                 body: SamplingFields, param: str) -> list[Run]:
        """The engine requests of n completions per prompt, choice index prompt * n + j."""
        try:                                   # compile the constraint now: a bad one is a 400
            self.llm.constraints(sp)
        except ValueError as e:
            raise compile_error(e, constraint(body)[1] or "bad_words") from None
        runs = []
        for i, (ids, echo) in enumerate(zip(prompts_ids, echoes)):
            if body.truncate_prompt_tokens is not None:
                ids = ids[-body.truncate_prompt_tokens:]
            self.check_fits(ids, sp, param)
            for j in range(body.n):
                child = sp if j == 0 or sp.seed is None else dataclasses.replace(sp, seed=sp.seed + j)
                runs.append(Run(i * body.n + j, ids, child, echo, j == 0))
        return runs

    def prepare_completion(self, body: CompletionRequest) -> list[Run]:
        """Tokenize and check a completion request (runs off the event loop). max_tokens=0 with
        echo (prompt scoring) runs one token, which the response leaves out, as vLLM does."""
        max_tokens = 16 if body.max_tokens is None else max(1, body.max_tokens)   # OpenAI's default: 16
        sp = sampling(body, max_tokens, body.logprobs)
        if body.echo and body.logprobs is not None:    # prompt scoring (lm-eval's loglikelihood requests)
            sp = dataclasses.replace(sp, prompt_logprobs=body.logprobs)
        if body.prompt_logprobs is not None:
            sp = dataclasses.replace(sp, prompt_logprobs=max(body.prompt_logprobs, sp.prompt_logprobs or 0))
        prompts = body.prompt if isinstance(body.prompt, list) and body.prompt and not isinstance(
            body.prompt[0], int) else [body.prompt]
        if not prompts:
            raise BadRequest("prompt is empty: give at least one token", "prompt")
        truncates = body.truncate_prompt_tokens is not None
        all_ids = [self.encode(p, "prompt", body.add_special_tokens, truncates) if isinstance(p, str)
                   else list(p)
                   for p in prompts]
        echoes = [(p if isinstance(p, str) else self.llm.decode(ids)) if body.echo else ""
                  for p, ids in zip(prompts, all_ids)]
        runs = self.runs_for(all_ids, echoes, sp, body, "prompt")
        for run in runs:
            run.echo_only = body.max_tokens == 0
        return runs

    def prepare_chat(self, body: ChatRequest) -> list[Run]:
        """Render, tokenize and check a chat request (runs off the event loop)."""
        ids = self.chat_ids(body.messages, body.add_generation_prompt, body.add_special_tokens,
                            body.chat_template, body.documents, body.chat_template_kwargs,
                            body.truncate_prompt_tokens is not None)
        if body.truncate_prompt_tokens is not None:
            ids = ids[-body.truncate_prompt_tokens:]
        # no max_tokens: until the model's maximum length, as vLLM does
        sp = sampling(body,
                      body.max_completion_tokens or body.max_tokens
                      or max(1, self.llm.max_model_len - len(ids)),
                      None)
        return self.runs_for([ids], [""], sp, body, "messages")
