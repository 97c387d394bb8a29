"""The prompt forms of the Python API (vLLM's), as token ids: `prompt_list` (what generate takes:
one prompt or many), `prompt_ids` (a string, token ids, TextPrompt or TokensPrompt) and
`render_conversations` (LLM.chat's conversations through the chat template)."""
from __future__ import annotations

import numbers
from typing import Callable, Iterable, Sequence

import torch


def prompt_list(prompts) -> list:
    """generate's prompts as a list: one prompt (a str, a dict, a list of integers) becomes a list
    of one; any other iterable (a generator included) is read into a list. Raises TypeError for
    something that is neither."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, torch.Tensor):
        return [prompts] if prompts.dim() == 1 else list(prompts)
    if not isinstance(prompts, Iterable):
        raise TypeError(f"prompts has type {type(prompts).__name__}: give a string, a list of token ids, "
                        "a dict prompt, or a list of these")
    prompts = list(prompts)
    if prompts and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompts):
        return [prompts]                      # one prompt of token ids, as vLLM reads a list of ints
    return prompts


def prompt_ids(p, encode: Callable[[str], list[int]]) -> tuple[list[int], str | None]:
    """A prompt's token ids, or ([], why it cannot run): a str is encoded with `encode` (text that
    is not valid Unicode fails alone), a sequence must hold integer token ids, a dict is vLLM's
    TextPrompt {"prompt": str} or TokensPrompt {"prompt_token_ids": [...]}."""
    if isinstance(p, str):
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as e:
            return [], (f"prompt is not valid Unicode text ({e.reason} at character {e.start}, "
                        f"{p[e.start]!r}): fix or drop it, e.g. text.encode('utf-8', 'replace').decode()")
        return encode(p), None
    if isinstance(p, dict):
        keys = set(p) - {"prompt", "prompt_token_ids"}
        if keys or ("prompt" in p) == ("prompt_token_ids" in p):
            return [], (f"a dict prompt holds exactly one of 'prompt' (text) or 'prompt_token_ids' "
                        f"(vLLM's TextPrompt / TokensPrompt); got keys {sorted(p)}")
        inner = p.get("prompt", p.get("prompt_token_ids"))
        if "prompt" in p and not isinstance(inner, str):
            return ([],
                    f"'prompt' must be a string, got {type(inner).__name__}: use 'prompt_token_ids' for ids")
        if "prompt_token_ids" in p and isinstance(inner, str):
            return [], "'prompt_token_ids' must be a list of token ids, got a string: use 'prompt' for text"
        return prompt_ids(inner, encode)
    if isinstance(p, (bytes, bytearray)):
        return [], "prompt is bytes: decode it to str first (e.g. p.decode('utf-8'))"
    if not isinstance(p, Sequence) and not hasattr(p, "tolist"):
        return [], (f"prompt has type {type(p).__name__}: give a string, a list of token ids, "
                    "{'prompt': text} or {'prompt_token_ids': ids}")
    ids = p.tolist() if hasattr(p, "tolist") else list(p)
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
    if bad is not None:
        return [], f"token ids must be integers: got {bad!r} ({type(bad).__name__})"
    return [int(t) for t in ids], None


def render_conversations(tok, messages, add_generation_prompt: bool = True, chat_template: str | None = None,
                         continue_final_message: bool = False, tools: list | None = None,
                         chat_template_kwargs: dict | None = None) -> list[tuple[str, list[int]]]:
    """(rendered text, token ids) of each conversation of LLM.chat's `messages` (one conversation, a
    list of {"role", "content"} dicts, or a list of them), through `tok`'s chat template (an
    mtpx.hf.tokenizer.HFTokenizer), encoded without adding special tokens (the template holds
    them). continue_final_message: the text ends with the last message's content (the template's
    end-of-turn cut). Raises ValueError naming the conversation when it is empty or not a list of
    dicts, or the template fails."""
    if isinstance(messages, dict) or not isinstance(messages, Sequence) or isinstance(messages, str):
        raise ValueError(f"messages has type {type(messages).__name__}: give a conversation (a list of "
                         "{'role': ..., 'content': ...} dicts) or a list of conversations")
    conversations = [messages] if not messages or isinstance(messages[0], dict) else list(messages)
    prompts = []
    for i, conv in enumerate(conversations):
        where = f"conversation {i}" if len(conversations) > 1 else "messages"
        if isinstance(conv, (str, dict)) or not isinstance(conv, Sequence) or not conv or \
                not all(isinstance(m, dict) for m in conv):
            raise ValueError(f"{where} must be a non-empty list of {{'role': ..., 'content': ...}} dicts, "
                             f"got {conv!r:.80}")
        try:
            text = tok.apply_chat_template(list(conv), add_generation_prompt=add_generation_prompt,
                                           chat_template=chat_template, tools=tools,
                                           **(chat_template_kwargs or {}))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the template's own errors (raise_exception, bad roles)
            raise ValueError(f"{where}: the chat template failed: {e}".replace("\n", " ")) from None
        if continue_final_message:
            last = conv[-1].get("content")
            if isinstance(last, str) and last and last in text:
                text = text[: text.rindex(last) + len(last)]    # cut the template's end-of-turn
        prompts.append((text, list(tok.encode(text, add_special_tokens=False).ids)))
    return prompts
