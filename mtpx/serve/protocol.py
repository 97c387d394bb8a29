"""Request bodies of mtpx/serve/app.py: every field vLLM's OpenAI server accepts for
/v1/completions, /v1/chat/completions, /tokenize and /detokenize (vLLM's
entrypoints/openai/protocol.py names and defaults).

An unknown field is still a 400 (a typo is never ignored), and so is a value of the wrong JSON
type: bodies are validated strictly (pydantic's strict mode: "4" or true is not an integer, "true"
not a boolean; an integer is a float) and floats must be finite (no NaN or Infinity). Penalties,
min_tokens and logit_bias are applied (SamplingParams), and so are the constraints
(response_format, guided_*, structured_outputs, tools with tool_choice, allowed_token_ids,
bad_words: mtpx/serve/structured.py). A known field that mtpx cannot honour is
accepted only at its neutral value (`NEUTRAL`: no beam search, guided decoding unset, no tools,
...); any other value is a 400 naming the field (`unsupported_field`).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(Body):
    include_usage: bool | None = True          # vLLM's default when stream_options is given
    continuous_usage_stats: bool | None = False


class SamplingFields(Body):
    """The sampling fields both generation routes take (vLLM's *-sampling-params and
    *-extra-params); None means the default."""
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=128)
    best_of: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True   # no effect on fast (tokenizer.json) tokenizers, as in vLLM
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    return_token_ids: bool | None = False
    return_tokens_as_token_ids: bool | None = None
    request_id: str | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    min_tokens: int = Field(default=0, ge=0)
    logit_bias: dict[str, float] | None = None     # token id (a string, as OpenAI's JSON) -> bias
    # constraints (mtpx/serve/structured.py; at most one of response_format, guided_*, structured_outputs)
    allowed_token_ids: list[int] | None = None
    response_format: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None
    # accepted at their neutral value only (NEUTRAL)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    priority: int = 0
    logits_processors: list[Any] | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    max_tokens: int | None = Field(default=None, ge=0)     # 0: echo only (prompt scoring), as vLLM
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    add_special_tokens: bool = True
    suffix: str | None = None
    prompt_embeds: Any = None


class TextPart(Body):
    type: Literal["text"]
    text: str


class ChatMessage(Body):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message as the chat template sees it (text parts joined)."""
        d = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            d["content"] = "".join(p.text for p in self.content)
        return d


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True          # no reasoning parser: no effect, as in vLLM without one
    parallel_tool_calls: bool | None = False
    tools: list[dict[str, Any]] | None = None     # tool_choice "required" / named: a constraint
    tool_choice: str | dict[str, Any] | None = "none"
    bad_words: list[str] | None = None
    # accepted at their neutral value only (NEUTRAL)
    reasoning_effort: str | None = None
    echo: bool = False
    continue_final_message: bool = False
    mm_processor_kwargs: dict[str, Any] | None = None
    structural_tag: str | None = None


class TokenizeRequest(Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None      # default: True for prompt, False for messages (vLLM)
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[int]


_UNSET = (None,)
# field -> the values accepted (anything else is a 400): what mtpx's engine cannot do yet
NEUTRAL: dict[str, tuple] = {
    "use_beam_search": (False,), "length_penalty": (1.0,),
    "guided_decoding_backend": (None, "auto", "xgrammar"), "guided_whitespace_pattern": _UNSET,
    "priority": (0,),
    "logits_processors": (None, []), "cache_salt": _UNSET, "kv_transfer_params": (None, {}),
    "vllm_xargs": (None, {}), "suffix": (None, ""), "prompt_embeds": _UNSET,
    "reasoning_effort": _UNSET, "echo@chat": (False,), "continue_final_message": (False,),
    "mm_processor_kwargs": (None, {}), "structural_tag": _UNSET,
}
_WHY = {"use_beam_search": "(no beam search)", "length_penalty": "(beam search only)",
        "suffix": "(no fill-in-the-middle)", "cache_salt": "(the prefix cache is not salted)",
        "continue_final_message": "(use /v1/completions with the rendered prompt)"}


def unsupported_field(body: SamplingFields) -> tuple[str, str] | None:
    """(message, field) for the first field set to a value mtpx cannot honour, or None.
    best_of must equal n."""
    chat = isinstance(body, ChatRequest)
    for key, ok in NEUTRAL.items():
        name = key.removesuffix("@chat")
        if key.endswith("@chat") and not chat or name not in type(body).model_fields:
            continue
        value = getattr(body, name)
        if value not in ok:
            neutral = " or ".join(repr(v) for v in ok)
            return (f"{name}={value!r} is not supported yet {_WHY.get(name, '')}".rstrip()
                    + f"; only {neutral} is accepted", name)
    if body.best_of is not None and body.best_of != body.n:
        return (f"best_of={body.best_of} is not supported: it must equal n={body.n} (no server-side ranking)",
                "best_of")
    return None
