"""The tokenizer routes of vLLM's server: POST /tokenize (a prompt, or messages through the chat
template), POST /detokenize, GET /tokenizer_info (the tokenizer_config.json of the served
tokenizer, as vLLM's and lm-eval's remote tokenizer read it)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from mtpx.hf.tokenizer import tokenizer_config
from mtpx.serve.errors import BadRequest
from mtpx.serve.parsing import read_body
from mtpx.serve.protocol import DetokenizeRequest, TokenizeRequest
from mtpx.serve.state import State

router = APIRouter()


@router.get("/tokenizer_info")
async def tokenizer_info(state: State):
    tok, llm = state.llm.tokenizer, state.llm
    if tok is None:
        raise BadRequest("this model has no tokenizer: send token ids", None, 404)
    info = tokenizer_config(tok)
    return info | {"model_max_length": llm.max_model_len, "vocab_size": tok.get_vocab_size(),
                   "eos_token_id": llm.eos_token_id}


@router.post("/tokenize")
async def tokenize(request: Request, state: State):
    body = await read_body(request, TokenizeRequest)
    parser = state.parser
    parser.check_tokenize(body)
    if body.prompt is not None:
        special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = await asyncio.to_thread(parser.encode, body.prompt, "prompt", special)
    else:
        ids = await asyncio.to_thread(parser.chat_ids, body.messages, body.add_generation_prompt,
                                      bool(body.add_special_tokens), body.chat_template, None,
                                      body.chat_template_kwargs)
    out = {"tokens": ids, "count": len(ids), "max_model_len": state.llm.max_model_len}
    if body.return_token_strs:
        out["token_strs"] = [state.llm.tokenizer.id_to_token(i) for i in ids]
    return out


@router.post("/detokenize")
async def detokenize(request: Request, state: State):
    body = await read_body(request, DetokenizeRequest)
    state.parser.check_model(body.model)
    vocab_size = state.llm.model.cfg.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})", "tokens")
    return {"prompt": state.llm.decode(body.tokens)}
