"""The Python API, in vLLM's style:

    from mtpx import LLM, SamplingParams
    llm = LLM(model="checkpoints/demo", spec="mtp8")
    outs = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=64))
    outs[0].text, outs[0].output_token_ids, outs[0].finish_reason, outs[0].spec.num_accepted_tokens

Its parts: prompt forms and chat rendering (mtpx/engine/prompts.py), vLLM's speculative_config
(mtpx/engine/speculative_config.py), the client that drives the engine (mtpx/engine/bench_client.py),
automatic k's step costs at start-up (Engine.calibrate, mtpx/auto_k/calibration.py).
"""
from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Callable, Sequence

import torch

from mtpx.engine.config import EngineConfig, with_overrides, resolve_compile
from mtpx.auto_k import AutoDraftLength
from mtpx.engine.tree_choice import choice_policy
from mtpx.core.request import Request
from mtpx.core.sampling_params import SamplingParams
from mtpx.engine.api_args import check_device, check_threads, sampling_params_list, structured_outputs_config
from mtpx.core.stop_strings import StopStrings, cut_at_stop, stop_after
from mtpx.engine.bench_client import progress_bar, run_client
from mtpx.engine.engine import Engine
from mtpx.engine.prompts import prompt_ids, prompt_list, render_conversations
from mtpx.engine.speculative_config import check_num_speculative_tokens, from_speculative_config
from mtpx.engine.warmup import warm_up
from mtpx.outputs import Logprob, RequestOutput
from mtpx.models.model import MTPForCausalLM
from mtpx.spec_decode import build_speculator

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "checkpoints" / "demo"
AUTO_MAX_SINGLE_MODULE = 4     # num_speculative_tokens=auto with mtp1: k in 0 .. this
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "auto": None}     # auto: the checkpoint's own dtype


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class LLM:
    """model: a checkpoint folder — mtpx's, or Hugging Face's (Qwen3NextForCausalLM,
    LlamaForCausalLM, Qwen3ForCausalLM; sharded safetensors, MTP heads in the Qwen3-Next or
    DeepSeek layout; mtpx.hf.loader.load_pretrained) — or an MTPForCausalLM (then pass
    `tokenizer` to use string prompts); spec: None (plain decoding), "mtp1" (single-module MTP)
    or "mtp8" (multi-module MTP); num_speculative_tokens: drafts per step (default: 1 for mtp1,
    all modules for mtp8), or "auto": each step picks k in 0 .. all modules (mtp8) or 0 .. 4 (mtp1)
    from online acceptance and measured step costs (mtpx/auto_k/); cost_model_file:
    with "auto", a JSON file of step costs to load, or to write after calibrating at start-up when
    it does not exist, refused (ValueError) when measured on another engine (None: the step-cost
    cache, auto_k.store.step_cost_cache_path; the source is in `calibration`); dtype: "float32",
    "float64", "bfloat16", "float16" or "auto" (the checkpoint's own: mtpx.hf.loader.checkpoint_dtype)
    for a checkpoint folder (a model instance keeps its own dtype); threads: torch threads, or a
    callable threads(model) that sets them once the model is loaded and before anything is
    compiled or calibrated (its result is kept as `thread_choice`; torch.compile guards on the
    thread count, so changing it later would compile every graph again); draft_path:
    a safetensors file of MTP modules to attach (tools/export_checkpoint.py --layout draft);
    allow_pickle: read pickle-only folders with torch.load(weights_only=True); device: where a
    checkpoint folder's weights go ("cpu", "cuda"); engine_config and **overrides: the engine's
    EngineConfig and any of its fields (max_num_seqs, block_size, enable_prefix_caching, verify,
    compile, ...: mtpx/engine/config.py), as vLLM's LLM takes its engine arguments;
    speculative_config: vLLM's form of spec + num_speculative_tokens, {"method": "mtp",
    "num_speculative_tokens": k} (also draft_path, verify, draft_sample_method; vLLM's per-model
    method names, "deepseek_mtp", "qwen3_next_mtp", "mimo_mtp", ..., mean "mtp");
    tensor_parallel_size (an engine setting): split a checkpoint folder's model over that many
    processes, started here (docs/tensor_parallel.md; `shutdown()` stops them). With compile
    the decode step is compiled here by a short warm-up whose cost is in `compile_stats`.
    Raises ValueError for an unknown spec, dtype or engine setting (naming the closest), or more
    speculative tokens than multi-module MTP has modules, or a num_speculative_tokens that is not
    an integer or "auto"; FileNotFoundError for a missing checkpoint (a hub id is named as one:
    nothing is downloaded)."""

    def __init__(self, model: str | Path | MTPForCausalLM = DEFAULT_MODEL, spec: str | None = None,
                 num_speculative_tokens: int | None = None, dtype: str = "float32", tokenizer=None,
                 threads: int | Callable | None = None, draft_path: str | Path | None = None,
                 allow_pickle: bool = False, device: str = "cpu",
                 engine_config: EngineConfig | None = None, speculative_config: dict | None = None,
                 cost_model_file: str | Path | None = None, **overrides):
        if speculative_config is not None:
            if spec is not None or num_speculative_tokens is not None:
                raise ValueError("give either speculative_config or spec / num_speculative_tokens, not both")
            spec, num_speculative_tokens, extra = from_speculative_config(speculative_config, model)
            draft_path = extra.pop("draft_path", draft_path)
            overrides = {**extra, **overrides}
        so_config = structured_outputs_config(overrides.pop("structured_outputs_config", None))
        overrides = {**so_config, **overrides}
        config = with_overrides(engine_config, **overrides)
        if config.compile is None:                  # the API runs eager unless asked (EngineConfig.compile)
            config = with_overrides(config, compile=resolve_compile(None, "api"))
        check_threads(threads)
        check_device(device)
        if threads is not None and not callable(threads):
            torch.set_num_threads(threads)
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype '{dtype}': choose one of {sorted(DTYPES)}")
        auto = check_num_speculative_tokens(num_speculative_tokens) == "auto"
        if auto and spec is None:
            raise ValueError("num_speculative_tokens=auto needs a speculator: add +spec=mtp8 or +spec=mtp1")
        self.model_path = None if isinstance(model, MTPForCausalLM) else Path(model)
        self._draft_path = None if draft_path is None else Path(draft_path)
        self._tp_driver, self._tp_owner = None, False
        tp_size = config.tensor_parallel_size
        if tp_size > 1 or getattr(model, "tp", None) is not None:      # docs/tensor_parallel.md
            self._tp_driver, self._tp_owner = self._tensor_parallel(model, tp_size, dtype, device, draft_path,
                                                                    allow_pickle)
        if self._tp_owner:
            from mtpx.engine import tensor_parallel
            from mtpx.hf.loader import checkpoint_dtype
            self.model, self.tokenizer = tensor_parallel.load_shard(
                model, self._tp_driver.tp, checkpoint_dtype(model) if dtype == "auto" else DTYPES[dtype],
                device, draft_path, allow_pickle)
            self.model.eval().tp_driver = self._tp_driver
        elif isinstance(model, MTPForCausalLM):
            self.model, self.tokenizer = model.eval(), tokenizer
        else:
            from mtpx.hf.loader import checkpoint_dtype, load_pretrained
            torch_dtype = checkpoint_dtype(model) if dtype == "auto" else DTYPES[dtype]
            self.model, self.tokenizer = load_pretrained(model, dtype=torch_dtype, draft_path=draft_path,
                                                         allow_pickle=allow_pickle, device=device)
        # a forward of one rank alone would wait for the others: a tensor-parallel model is not timed
        self.thread_choice = (threads(None if self._tp_driver else self.model) if callable(threads) else None)
        self.spec = spec
        self._grammars = None       # the GrammarCompiler of structured outputs, built on first use
        k = (AUTO_MAX_SINGLE_MODULE if spec == "mtp1" else None) if auto else num_speculative_tokens
        self.speculator = build_speculator(spec, self.model, k, tree=None if auto else config.tree)
        policy = AutoDraftLength(self.speculator.num_speculative_tokens) if auto else None
        if auto and config.tree is not None:        # chain or tree per step (docs/trees.md)
            policy = choice_policy(spec, self.model, self.speculator.num_speculative_tokens, config.tree)
        self.engine = Engine(self.model, self.speculator, config, draft_length=policy)
        self.max_model_len = self.engine.max_model_len
        self.compile_stats = warm_up(self.engine)
        # auto: {"source", "seconds", "step_costs_ms"}: from cost_model_file, else the cache, else
        # calibrated now
        self.calibration = self.engine.calibrate(cost_model_file, self.model_path, self._draft_path, spec,
                                                 device, _stderr_line) if auto else None

    def _tensor_parallel(self, model, tp_size: int, dtype, device, draft_path, allow_pickle):
        """(the Driver of the tensor-parallel ranks, whether this LLM started them): started here
        for a checkpoint folder; for a model an LLM sharded before (its `tp_driver`), that LLM's
        ranks, which build this engine too. Raises ValueError (one line) otherwise."""
        from mtpx.engine import tensor_parallel
        if isinstance(model, MTPForCausalLM):
            driver = getattr(model, "tp_driver", None)
            world = getattr(getattr(model, "tp", None), "world_size", 1)
            if world > 1 and world != tp_size:
                raise ValueError(f"engine.tensor_parallel_size={tp_size} but this model is split over "
                                 f"{world} ranks: pass tensor_parallel_size={world}")
            if driver is None or driver.closed:
                closed = " (this model's workers were shut down)" if driver is not None else ""
                raise ValueError(f"engine.tensor_parallel_size={tp_size} needs a checkpoint folder "
                                 "(model=PATH): each rank reads its own shard of it; an in-memory model "
                                 f"cannot be split across processes{closed}")
            return driver, False
        from mtpx.hf.loader import checkpoint_dtype
        return tensor_parallel.start(tp_size, dict(
            path=model, dtype=checkpoint_dtype(model) if dtype == "auto" else DTYPES[dtype], device=device,
            draft_path=draft_path, allow_pickle=allow_pickle, threads=torch.get_num_threads())), True

    def shutdown(self) -> None:
        """engine.tensor_parallel_size > 1: stop the worker processes (also done at exit) when this
        LLM started them, else free its engine on them; no-op otherwise. The LLM (and any other
        over the same workers) cannot generate afterwards."""
        if self._tp_driver is None:
            return
        if self._tp_owner:
            self._tp_driver.close()
        else:
            self.engine.runner.drop()

    @property
    def num_speculative_tokens(self) -> int:
        return 0 if self.speculator is None else self.speculator.num_speculative_tokens

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's LLM.reset_prefix_cache). Returns False, changing
        nothing, while a request holds blocks."""
        return self.engine.kv.reset_prefix_cache()

    def get_tokenizer(self):
        """The tokenizer string prompts are encoded with (vLLM's LLM.get_tokenizer): mtpx's own or
        an mtpx.hf.tokenizer.HFTokenizer, both with encode(text).ids and decode(ids); None for a
        model without one."""
        return self.tokenizer

    @property
    def eos_token_id(self) -> int | None:
        """The model's end-of-sequence id (the first one when the checkpoint lists several)."""
        ids = self.eos_token_ids
        return ids[0] if ids else None

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends a request unless SamplingParams.ignore_eos (config.json's
        `eos_token_id`, an int or a list, and generation_config.json's for Hugging Face folders)."""
        eos = self.model.cfg.eos_token_id
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            where = ("pass tokenizer= with the model" if not self.model_path else
                     f"checkpoint folder {self.model_path} has no tokenizer.json "
                     "(add the model's tokenizer.json)")
            raise ValueError(f"string prompts need a tokenizer: {where}, or give prompts as token ids")
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm=False, on_finish=None, on_step=None, max_concurrency: int | None = None,
                 arrival_offsets: Sequence[float] | None = None) -> list[RequestOutput]:
        """prompts, as vLLM takes them: one prompt or a list (or any iterable, a generator
        included) of prompts, each a string, a list of token ids, {"prompt": str} (TextPrompt) or
        {"prompt_token_ids": [...]} (TokensPrompt); a list of integers is one prompt of token ids.
        sampling_params: one SamplingParams for all or a list, one per prompt (a dict is refused, as
        vLLM's types do: SamplingParams(**d)). use_tqdm: True for a tqdm
        bar of finished prompts on stderr, or a callable taking tqdm's arguments (vLLM's); mtpx's
        default is False. Returns one RequestOutput per prompt, in order. A bad prompt (empty, too
        long, a dict without a prompt) fails alone: its output has `error` set and finish_reason
        None; the rest are generated. A prompt whose length plus max_tokens exceeds max_model_len
        stops at max_model_len (finish_reason "length") with one warning naming both. With
        SamplingParams.n > 1 a prompt runs as n engine requests (completion j seeded with
        seed + j, as vLLM's parallel sampling does) and its RequestOutput.outputs holds all n; the
        top-level fields are completion 0's. on_finish(request) as each engine request ends (its
        index is the prompt's for completion 0, a fresh id for the others); on_step(engine) after
        every engine step (may call engine.abort); max_concurrency: requests in the engine at once
        (benchmark client limit); arrival_offsets: seconds after the start at which each prompt
        arrives (request rate)."""
        prompts = prompt_list(prompts)
        params = sampling_params_list(sampling_params, len(prompts))
        if arrival_offsets is not None and len(arrival_offsets) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(arrival_offsets)} arrival offsets")
        bar = progress_bar(use_tqdm, len(prompts))
        if bar is not None:
            user_finish = on_finish

            def on_finish(r, _user=user_finish):
                if r.index < len(prompts):
                    bar.update(1)
                if _user is not None:
                    _user(r)
        requests, children = self._engine_requests(prompts, params, arrival_offsets)
        if bar is not None:
            bar.update(sum(mine[0].error is not None for mine in children))
        try:
            run_client(self.engine, requests, on_finish, on_step, max_concurrency)
        finally:
            if bar is not None:
                bar.close()
        return [self._prompt_output(p, mine) for p, mine in zip(prompts, children)]

    def _engine_requests(self, prompts: list, params: list[SamplingParams],
                         arrival_offsets: Sequence[float] | None
                         ) -> tuple[list[Request], list[list[Request]]]:
        """generate's engine requests: (those that can run, in order; children[i]: prompt i's n
        requests, a failed one included with its error), warning once about prompts whose length
        plus max_tokens exceeds max_model_len."""
        requests, children = [], []            # children[i]: prompt i's engine requests, in order
        next_id = len(prompts)
        over = []                              # (prompt index, prompt length, max_tokens) past max_model_len
        for i, (p, sp) in enumerate(zip(prompts, params)):
            ids, err = prompt_ids(p, self.encode)
            err = err or self.engine.validate_prompt(ids)
            if err is None and len(ids) + sp.max_tokens > self.max_model_len:
                over.append((i, len(ids), sp.max_tokens))
            mine = []
            for j in range(sp.n):
                child = sp if sp.n == 1 else dataclasses.replace(
                    sp, n=1, seed=None if sp.seed is None else sp.seed + j)
                req = self.new_request(i if j == 0 else next_id, ids, child, err)
                next_id += j > 0
                if arrival_offsets is not None:
                    req.arrival_offset = float(arrival_offsets[i])
                mine.append(req)
                if req.error is None:
                    requests.append(req)
            children.append(mine)
        if over:
            i, n, m = over[0]
            more = f" (and {len(over) - 1} more prompts)" if len(over) > 1 else ""
            warnings.warn(f"SamplingParams.max_tokens={m} with prompt {i}'s {n} tokens exceeds max_model_len="
                          f"{self.max_model_len}{more}: it stops at {self.max_model_len - n} output tokens "
                          "(finish_reason 'length'); lower max_tokens or raise engine.max_model_len",
                          stacklevel=3)        # the caller of generate
        return requests, children

    def _prompt_output(self, p, mine: list[Request]) -> RequestOutput:
        """generate's RequestOutput of prompt `p` from its engine requests (n > 1: all n in
        `completions`)."""
        o = self.request_output(mine[0])
        text = p.get("prompt") if isinstance(p, dict) else p
        o.prompt = text if isinstance(text, str) else None
        if len(mine) > 1:
            o.completions = [self.request_output(r).outputs[0] for r in mine]
            for j, c in enumerate(o.completions):
                c.index = j
        return o

    def chat(self, messages, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm=False, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list | None = None,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Generate replies to conversations, as vLLM's LLM.chat: messages is one conversation (a
        list of {"role", "content"} dicts) or a list of them. Each is rendered with the tokenizer's
        chat template (tokenizer_config.json's chat_template or chat_template.jinja; the same
        rendering as mode=serve's /v1/chat/completions and the chat data sets, mtpx.data.chat),
        or with `chat_template` (a jinja source, or the name of one of the tokenizer's templates),
        encoded without adding special tokens (the template holds them) and generated as
        `generate` does (sampling_params and use_tqdm alike). continue_final_message: render the
        last (assistant) message open, to be continued (add_generation_prompt must then be False).
        tools and chat_template_kwargs (e.g. {"enable_thinking": False}) go to the template.
        Returns one RequestOutput per conversation; its `prompt` is the rendered text.

        Raises ValueError (naming the conversation) when the model has no tokenizer, the
        tokenizer has no chat template and none is given, a conversation is empty or not a list of
        dicts, or the template fails."""
        from mtpx.hf.tokenizer import HFTokenizer
        if self.tokenizer is None:
            raise ValueError("chat() needs a tokenizer with a chat template: pass tokenizer= with the model, "
                             "or use generate() with token ids")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message=True continues the last message: "
                             "set add_generation_prompt=False")
        tok = self.tokenizer if hasattr(self.tokenizer, "apply_chat_template") else HFTokenizer(
            self.tokenizer, source=str(self.model_path or "the model's tokenizer"))
        prompts = render_conversations(tok, messages, add_generation_prompt, chat_template,
                                       continue_final_message, tools, chat_template_kwargs)
        outs = self.generate([{"prompt_token_ids": ids} for _, ids in prompts], sampling_params,
                             use_tqdm=use_tqdm)
        for o, (text, _) in zip(outs, prompts):
            o.prompt = text
        return outs

    def new_request(self, index: int, ids: list[int], sp: SamplingParams,
                    error: str | None = None) -> Request:
        """An engine request with id `index` for prompt ids: the stop ids (EOS unless ignore_eos)
        and stop strings of `sp` set up; error: why it cannot run (the caller does not queue it).
        Raises ValueError for stop strings without a tokenizer, and as `constraints`."""
        stop = set(sp.stop_token_ids)
        if not sp.ignore_eos:
            stop.update(self.eos_token_ids)
        req = Request(index, ids, sp, frozenset(stop))
        if error is None:
            req.grammar, req.bad_words_token_ids = self.constraints(sp)
        if sp.stop and error is None:
            if self.tokenizer is None:
                raise ValueError("SamplingParams.stop needs a tokenizer: pass tokenizer= with the model, "
                                 "or stop on token ids (stop_token_ids)")
            req.stop_strings = StopStrings(sp.stop, self.decode)
        req.error = error
        return req

    def constraints(self, sp: SamplingParams) -> tuple[object, list[list[int]]]:
        """(compiled grammar of sp.structured_outputs or None, sp.bad_words as token-id
        sequences), from this model's tokenizer; compiled grammars are cached per constraint
        (mtpx/structured/grammar.py). Raises ValueError naming the field for an invalid
        constraint, or for a constraint without a tokenizer."""
        if sp.structured_outputs is None and not sp.bad_words:
            return None, []
        if self.tokenizer is None:
            field = "structured_outputs" if sp.structured_outputs is not None else "bad_words"
            raise ValueError(f"SamplingParams.{field} needs the model's tokenizer: "
                             "pass tokenizer= with the model")
        grammar = None
        if sp.structured_outputs is not None:
            if self.engine.config.tensor_parallel_size > 1:
                raise ValueError("SamplingParams.structured_outputs is not supported with "
                                 "tensor_parallel_size > 1")
            if self._grammars is None:
                from mtpx.structured.grammar import GrammarCompiler
                self._grammars = GrammarCompiler(self.tokenizer, self.model.cfg.vocab_size,
                                                 self.eos_token_ids)
            so = sp.structured_outputs
            if self.engine.config.structured_outputs_disable_any_whitespace and not so.disable_any_whitespace:
                so = dataclasses.replace(so, disable_any_whitespace=True)
            grammar = self._grammars.compile(so)
        return grammar, bad_words_token_ids(sp.bad_words or [], self.tokenizer)

    def _logprob_dict(self, token: int, entry) -> dict[int, Logprob]:
        """vLLM's {token id: Logprob} for one position: the top tokens, then the token itself."""
        lp, rank, top = entry
        out = {i: Logprob(v, j + 1, self.decode([i])) for j, (i, v) in enumerate(top)}
        out[token] = Logprob(lp, rank, self.decode([token]))
        return out

    def request_output(self, r: Request) -> RequestOutput:
        """What generate returns for request `r` (its text decoded), e.g. from an on_finish callback."""
        text = self.decode(r.output_token_ids)
        if isinstance(r.stop_reason, str):
            after = stop_after(r.output_token_ids, r.params.min_tokens, text, self.decode)
            text = cut_at_stop(text, r.stop_reason, r.params.include_stop_str_in_output, after)
        logprobs = prompt_logprobs = None
        if r.params.logprobs is not None:
            logprobs = [self._logprob_dict(t, e) for t, e in zip(r.output_token_ids, r.logprobs)]
        if r.params.prompt_logprobs is not None and r.error is None:
            prompt_logprobs = [None] + [self._logprob_dict(t, r.prompt_logprobs[i]) if i in r.prompt_logprobs
                                        else None for i, t in enumerate(r.prompt_token_ids) if i > 0]
        return RequestOutput(
            index=r.index, prompt_token_ids=r.prompt_token_ids, stop_reason=r.stop_reason,
            output_token_ids=r.output_token_ids, text=text,
            finish_reason=r.finish_reason, spec=r.spec, arrival_time=r.arrival_time,
            first_token_time=r.first_token_time, finish_time=r.finish_time, error=r.error,
            logit_gaps=r.logit_gaps if self.engine.config.record_logit_gaps else None,
            num_cached_tokens=r.num_cached_tokens, num_preemptions=r.num_preemptions,
            emission_times=r.emission_times, logprobs=logprobs, prompt_logprobs=prompt_logprobs)


def bad_words_token_ids(words: list[str], tokenizer) -> list[list[int]]:
    """vLLM's SamplingParams.update_from_tokenizer: each bad word as tokens, without and (when that
    starts another token of the same length) with a leading space."""
    out = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False).ids
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False).ids
        out += [ids for ids in (plain,) if ids]
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            out.append(spaced)
    return out
