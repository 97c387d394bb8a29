"""The model runner: every tensor of the engine and every model call (vLLM v1's GPUModelRunner).

`execute(scheduler_output)` runs one engine step and returns a `RunnerOutput`; it reads the scheduled requests
and writes none of their fields (the scheduler owns request progress). It owns the ModelCache (KV, recurrent
states, token buffer, block tables, batch slots), the speculator and the decode step.

One step: free the batch slots of preempted requests -> admit new ones (slot, tokens, recurrent state from the
last prefix-hit block, speculator rows) -> prefill chunks through the target, first tokens sampled, the
speculator catches up (and drafts for prompts that are complete) -> the decode step: the target over the
verification windows [x_n, d_1 .. d_k] keeping each Gated DeltaNet window in chunked form, one `verify` for
greedy and sampled requests, the recurrent state rebuilt at the accepted position (invariant 3; plain decoding
stores its one token's state in the forward), the accepted tokens written to the token buffer, the
speculator's round -> one host transfer of emitted tokens, accepted counts, next drafts and final positions.

The decode step's shapes come from StepShapes and its three calls from a DecodeStep, eager or compiled behind
one interface (engine/decode_step.py, engine/compiled.py); prefill and decode hand the speculator the same
DraftBatch. Inside the decode step nothing reads a tensor on the host but that one transfer
(tests/test_model_runner.py counts them); prefix-cache boundary states are placed from host-known positions.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mtpx.cache.model_cache import ModelCache
from mtpx.cache.state import ascending_run
from mtpx.engine.compiled import CompiledDecode
from mtpx.engine.decode_alone import decode_alone
from mtpx.engine.decode_step import EagerStep, StepShapes
from mtpx.engine.lazy_catch_up import LazyCatchUp
from mtpx.engine.logits import logprobs, process_logits
from mtpx.engine.malloc import tune_malloc
from mtpx.core.scheduler import ScheduledDecode, ScheduledPrefill, SchedulerOutput
from mtpx.spec_decode.common import last_valid
from mtpx.spec_decode.protocol import DraftBatch, Drafts
from mtpx.spec_decode.sampler import RequestSampling, sample
from mtpx.spec_decode.tree_draft import TreeSpeculator
from mtpx.spec_decode.verification import verify
from mtpx.engine.tree_step import tree_decode, tree_parts
from mtpx.engine.tree_choice import TreeChoice, verify_with
from mtpx.structured.drafts import draft_sampler
from mtpx.structured.masks import GrammarMasks


@dataclass
class StepTiming:
    """Wall time of one engine step's phases (seconds; on CUDA the device is synchronized at each
    boundary, so the times are device times), for the cost model (mtpx.auto_k.costs).

    num_decodes: requests verified; num_draft_tokens: draft tokens verified, summed over them;
    num_prefill_tokens: prompt tokens prefilled; prefill_s: the prefill forward, its first
    tokens and the drafting after it; verify_s: the verification forward, verification, the
    recurrent-state commit; draft_s: the draft loop after verification (re-prefill included);
    prefill_draft_s: the part of prefill_s the speculator ran (its modules over the prompt
    tokens, then the first drafts); num_prefill_module_tokens: those prompt tokens times the
    modules run over them; catch_up_s, num_catch_up_module_tokens: the decode step's lazy catch-up
    (mtpx/engine/lazy_catch_up.py; not in draft_s) and the positions times modules it ran over.
    """

    num_decodes: int
    num_draft_tokens: int
    num_prefill_tokens: int
    prefill_s: float
    verify_s: float
    draft_s: float
    prefill_draft_s: float = 0.0
    num_prefill_module_tokens: int = 0
    catch_up_s: float = 0.0
    num_catch_up_module_tokens: int = 0


@dataclass
class RequestResult:
    """What one step did for one scheduled request.

    token_ids: verified tokens to append: the accepted drafts then the target's next token (a
        decode), the first token after a complete prompt, or [] for a chunk mid-prefill; the
        scheduler may cut them at a stop. num_draft_tokens, num_accepted: drafts verified and the
        verifier's raw accepted count. draft_token_ids: the next num_speculative_tokens drafts
        ([] without a speculator or mid-prefill; their draft distributions, when sampled, stay
        with the runner for the next step's verification). num_final_tokens: positions [0, P)
        whose KV is final for the target and every draft module if token_ids are committed
        (KVCacheManager.cache_blocks).
        logit_gaps: top-2 logit gap at each of token_ids (record_logit_gaps), else None.
        logprobs: per token of token_ids, (its log-probability, its rank, [(token id,
        log-probability)] of the top SamplingParams.logprobs), when the request asks for them.
        prompt_logprobs: (prompt position i, the same entry for token x_i given x_<i) for the
        prompt positions this prefill chunk scored (SamplingParams.prompt_logprobs).
    """

    token_ids: list[int]
    num_draft_tokens: int = 0
    num_accepted: int = 0
    draft_token_ids: list[int] | None = None
    num_final_tokens: int = 0
    logit_gaps: list[float] | None = None
    logprobs: list[tuple[float, int, list[tuple[int, float]]]] | None = None
    prompt_logprobs: list[tuple[int, tuple[float, int, list[tuple[int, float]]]]] | None = None
    leaf_rank: int = 0        # a tree round whose accepted path ended in a leaf: its sibling rank


@dataclass
class RunnerOutput:
    """results: request index -> RequestResult, one per scheduled request; timing: the step's
    StepTiming (None without record_step_timings)."""

    results: dict[int, RequestResult]
    timing: StepTiming | None = None


class ModelRunner:
    """model: the target with its MTP modules; speculator: None or a Speculator
    (mtpx/spec_decode/protocol.py); config: the engine's EngineConfig (resolved: max_model_len and
    num_blocks set); max_len: positions a batch slot holds (prompt, output, window and drafts);
    tree_speculator: automatic k's leaf tree over the chain's round (mtpx/engine/tree_choice.py)."""

    def __init__(self, model, speculator, config, max_len: int, tree_speculator=None):
        self.model, self.speculator, self.config = model, speculator, config
        self.device = next(model.parameters()).device
        if config.tune_malloc and self.device.type == "cpu":
            tune_malloc()
        self.num_speculative_tokens = 0 if speculator is None else speculator.num_speculative_tokens
        self.tree = isinstance(speculator, TreeSpeculator)          # tree drafting (mtpx/engine/tree_step.py)
        self.tree_spec = speculator if self.tree else tree_speculator      # the speculator of tree steps
        self.block_size = config.block_size
        hybrid = any(t == "linear_attention" for t in model.cfg.layer_types)
        self.boundary_states = config.enable_prefix_caching and hybrid
        # a layer region must trace whole: FlashInfer's call and routed experts break the graph
        regions = (bool(config.compile) and config.compile_regions and config.attention_backend == "torch"
                   and model.cfg.num_experts == 0)
        self.cache = ModelCache(model, config.max_num_seqs, max_len,
                                0 if speculator is None else speculator.num_draft_modules,
                                config.block_size, config.num_blocks, self.boundary_states,
                                config.attention_backend, config.gdn_backend, regions)
        if speculator is not None:
            speculator.allocate(self.cache)
            self.cache.reserve_windows(max(self.num_speculative_tokens, self.tree_spec.num_speculative_tokens
                                           if self.tree_spec else 0) + 1)    # the longest verification
        self.lazy = (None if speculator is None             # the runner's clock, read when it runs
                     else LazyCatchUp(speculator, self.cache, now=lambda: self._now()))
        self.step = (CompiledDecode(model, self.cache, speculator, config.compile_backend,
                                    precompile=config.compile_cache, ragged=config.ragged_batch)
                     if config.compile else EagerStep(model, self.cache, speculator))
        self.tree_stats, self.tree_graphs = tree_parts(config, self.step, self.tree_spec)   # or None
        self._verify_with = verify_with(config, self.num_speculative_tokens, tree_speculator)   # method, rule
        self.choice = None if tree_speculator is None else TreeChoice(tree_speculator, self.cache)
        self.rows: dict[int, int] = {}             # request index -> batch slot
        self._draft_probs: dict[int, torch.Tensor] = {}   # request index -> its sampled drafts' [k, V] q
        self.grammars = GrammarMasks()     # structured output's per-request matchers (xgrammar loads on use)

    @property
    def compiled(self) -> CompiledDecode | None:
        """The compiled decode step (its build statistics), None when eager."""
        return self.step if self.step.static else None

    # ---- batch slots ----------------------------------------------------------------------------
    @property
    def num_rows_in_use(self) -> int:
        """Batch slots held by requests."""
        return len(self.rows)

    def release(self, index: int) -> None:
        """Free the batch slot of a request that finished, was aborted or preempted (no-op without one)."""
        self._draft_probs.pop(index, None)
        if self.choice is not None:
            self.choice.release(index)
        row = self.rows.pop(index, None)
        if row is not None:
            self.cache.free_row(row)
            if self.lazy is not None:
                self.lazy.reset(row)

    def set_kv_write_guard(self, guard) -> None:
        """guard(slots) before every KV write (check_invariants)."""
        for c in self.cache.kv_caches:
            c.guard = guard

    def _admit(self, p: ScheduledPrefill) -> None:
        r, cache = p.request, self.cache
        row = self.rows[r.index] = cache.allocate_row()
        tokens = torch.tensor(r.all_token_ids, device=self.device)
        rows = torch.tensor([row], device=self.device)
        cache.write_tokens(rows, torch.arange(len(tokens), device=self.device)[None], tokens[None])
        if p.start > 0:               # resume the recurrence from the last hit block's state
            block = p.block_table[p.start // self.block_size - 1]
            for c in cache.recurrent:
                c.load_rows(rows, torch.tensor([block], device=self.device))
        if self.speculator is not None:
            self.speculator.reset_rows(rows, p.start)
            self.lazy.reset(row)

    # ---- one step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        for r in out.preempted:
            self.release(r.index)
        for p in out.prefills:
            if p.new:
                self._admit(p)
        for item in out.prefills + out.decodes:
            self.cache.set_block_table(self.rows[item.request.index], item.block_table)
        results: dict[int, RequestResult] = {}
        if self.lazy is not None:
            self.lazy.begin_step()
        t0 = self._now()
        prefill_draft_s, module_tokens = self._prefill(out.prefills, results, out.num_speculative_tokens == 0,
                                                       out.tree)
        t1 = self._now()
        verify_s, draft_s = self._decode(out.decodes, results, out.tree)
        if self.choice is not None:
            self.choice.proposed(out.prefills + out.decodes, out.tree)
        timing = None
        if self.config.record_step_timings:       # a prefill's catch-up is in its prefill_s, not draft_s
            timing = StepTiming(len(out.decodes), sum(d.num_draft_tokens for d in out.decodes),
                                sum(p.num_tokens for p in out.prefills), t1 - t0, verify_s, draft_s,
                                prefill_draft_s, module_tokens, *(self.lazy.spent if self.lazy else (0.0, 0)))
        return RunnerOutput(results, timing)

    # ---- a decode step alone (automatic k's calibration) -----------------------------------------
    @torch.inference_mode()
    def decode(self, decodes: list[ScheduledDecode]) -> tuple[float, float]:
        """The decode step of `decodes` alone, timed (mtpx/engine/decode_alone.py; automatic k's
        calibration, mtpx/auto_k/calibration.py): (its seconds, its draft round's seconds)."""
        return decode_alone(self, decodes)

    def _ragged(self, grid_tokens: int, real_tokens: int, static: bool = False, window: int = 1) -> bool:
        """Whether a forward of real_tokens on a grid of grid_tokens runs ragged
        (EngineConfig.ragged_batch): eager, only when the grid has padding; static (the compiled
        step), every verification window wider than one token, padding or not, so that each
        window width is one graph."""
        if not self.config.ragged_batch:
            return False
        return window > 1 if static else real_tokens < grid_tokens

    def _now(self) -> float:
        if not self.config.record_step_timings:
            return 0.0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _boundaries(self, items, starts: list[int], lengths: list[int]):
        """(batch_idx, token_idx, block_ids) of the tokens that end a paged block, from host-known
        positions (the Gated DeltaNet state after them is stored with the block); None without
        boundary states."""
        if not self.boundary_states:
            return None
        S, found = self.block_size, []
        for b, (item, start, length) in enumerate(zip(items, starts, lengths)):
            for p in range(start + (S - 1 - start % S), start + length, S):
                found.append((b, p - start, item.block_table[p // S]))
        bi, ti, blocks = zip(*found) if found else ((), (), ())
        return tuple(torch.tensor(x, dtype=torch.long, device=self.device) for x in (bi, ti, blocks))

    def _sampling(self, reqs) -> RequestSampling:
        return RequestSampling([r.params for r in reqs], [r.generator for r in reqs], self.device)

    def _draft_sampler(self, sampling: RequestSampling, num_drafts: list[int], reqs=(), pending=None):
        """num_drafts[b]: the drafts row b proposes this step (mtpx/structured/drafts.py)."""
        return draft_sampler(sampling, num_drafts, self.num_speculative_tokens, self.config, self.grammars,
                             reqs, pending)

    def _gaps(self, logits: torch.Tensor):
        if not self.config.record_logit_gaps:
            return None
        top2 = logits.float().topk(2, dim=-1).values
        return (top2[..., 0] - top2[..., 1]).tolist()

    def _prompt_logprobs(self, prefills: list[ScheduledPrefill], h: torch.Tensor) -> dict:
        """{batch row: [(prompt position i, entry for x_i)]} for the prefills that score their
        prompt: the chunk's positions p (hidden states h[b, t], p = start + t) predict x_{p+1},
        kept while p + 1 is a prompt position."""
        out = {}
        for b, p in enumerate(prefills):
            r = p.request
            if r.params.prompt_logprobs is None:
                continue
            P = len(r.prompt_token_ids)
            n = min(p.num_tokens, P - 1 - p.start)          # positions whose next token is in the prompt
            if n <= 0:
                continue
            logits = self.model.lm_head(h[b, :n])            # column t is position start + t; [n, vocab]
            nxt = torch.tensor(r.prompt_token_ids[p.start + 1: p.start + 1 + n], device=logits.device)
            (entries,) = logprobs([r.params.prompt_logprobs], logits[None], nxt[None])
            out[b] = [(p.start + 1 + i, e) for i, e in enumerate(entries)]
        return out

    def _prefill(self, prefills: list[ScheduledPrefill], results: dict,
                 defer: bool = False, tree: bool = False) -> tuple[float, int]:
        """The prefill chunks' forward, first tokens and first drafts (tree: the tree's); returns (seconds
        the speculator ran, prompt tokens times the modules it ran over them) for StepTiming. defer (a
        step without drafts): the modules' prefill waits for the lazy catch-up (lazy_catch_up.py)."""
        if not prefills:
            return 0.0, 0
        cache, model, dev = self.cache, self.model, self.device
        reqs = [p.request for p in prefills]
        rows = torch.tensor([self.rows[r.index] for r in reqs], device=dev)
        starts, lengths = [p.start for p in prefills], [p.num_tokens for p in prefills]
        meta = cache.meta(torch.tensor(starts, device=dev), torch.tensor(lengths, device=dev), rows)
        meta.row_run = ascending_run([self.rows[r.index] for r in reqs])
        meta.save_states = self._boundaries(prefills, starts, lengths)
        ids = torch.where(meta.valid, cache.tokens[rows[:, None], meta.positions], 0)
        if self._ragged(len(lengths) * max(lengths), sum(lengths)):
            meta.pack_valid(lengths)
        h = model.model(ids, meta, cache.target)
        if meta.packed is not None:
            h = meta.unpack(h)                                             # [B, T, hidden]
        last = [b for b, p in enumerate(prefills) if p.is_last]
        first: dict[int, int] = {}
        gaps = lps = None
        if last:
            idx = torch.tensor(last, device=dev)
            logits = model.lm_head(last_valid(h, meta)[idx])               # [L, vocab]
            sampling = self._sampling([reqs[b] for b in last])
            masked = process_logits([reqs[b] for b in last], logits, grammars=self.grammars)
            tok = (masked.argmax(-1) if sampling.all_greedy
                   else sample(sampling.probs(masked), sampling.uniforms([1] * len(last))[:, 0]))
            cache.write_tokens(rows[idx], torch.tensor([reqs[b].num_tokens for b in last], device=dev), tok)
            first = dict(zip(last, tok.tolist()))
            gaps = self._gaps(logits)
            lps = logprobs([reqs[b].params.logprobs for b in last], logits[:, None], tok[:, None])
        prompt_lps = self._prompt_logprobs(prefills, h)
        # with its first token a complete prompt has one more known token, and drafts
        num_tokens = [r.num_tokens + (b in first) for b, r in enumerate(reqs)]
        num_final = [s + n for s, n in zip(starts, lengths)]
        drafts, q = None, None
        draft_s, module_tokens = 0.0, 0
        rows_host = [self.rows[r.index] for r in reqs]
        # a step without drafts whose chunks are all at depth 0, none behind: plain decoding's prefill
        plain = self.speculator is None or (defer and not self.tree and not any(r.draft_depth for r in reqs)
                                            and not self.lazy.lagging(rows_host))
        if not plain:
            t0 = self._now()
            new = [p.num_new_drafts for p in prefills]
            batch = self._draft_batch(reqs, rows, torch.tensor(num_tokens, device=dev), meta.ends,
                                      [p.is_last for p in prefills], meta.positions[:, 0], h, new,
                                      self._draft_sampler(self._sampling(reqs), new, reqs, first)
                                      if last else None)
            spent = self.lazy.spent[0]
            held = self.lazy.prefill(batch, rows_host, [r.draft_depth for r in reqs],
                                     starts, lengths, defer and not self.tree)
            if held is None:
                proposed = (self.tree_spec if tree else self.speculator).propose(cache, batch)   # eager
                drafts, q, held = proposed.tokens.tolist(), proposed.probs, proposed.num_final
                module_tokens = batch.num_modules * sum(lengths)
            num_final = [min(a, b) for a, b in zip(num_final, held.tolist())]
            draft_s = self._now() - t0 - (self.lazy.spent[0] - spent)
        for b, p in enumerate(prefills):
            i = last.index(b) if b in first else None
            self._result(results, p, [first[b]] if i is not None else [], 0, 0,
                         drafts[b] if drafts is not None and i is not None else [],
                         q[b] if q is not None and i is not None else None, num_final[b],
                         None if gaps is None or i is None else [gaps[i]],
                         None if lps is None or i is None else lps[i], prompt_lps.get(b))
        return draft_s, module_tokens

    def _result(self, results: dict, item, token_ids: list[int], num_draft_tokens: int, num_accepted: int,
                drafts: list[int], probs: torch.Tensor | None, num_final: int, gaps=None, lps=None,
                prompt_lps=None) -> None:
        """results[index] = the RequestResult of a scheduled prefill chunk or decode (its fields;
        drafts: the round's draft row of the request, of which it keeps item.num_new_drafts;
        probs: their [k, V] draft distributions, kept here for the next step's verification)."""
        r = item.request
        if probs is None:
            self._draft_probs.pop(r.index, None)
        else:
            self._draft_probs[r.index] = probs
        results[r.index] = RequestResult(
            token_ids, num_draft_tokens, num_accepted,
            draft_token_ids=drafts[: item.num_new_drafts], num_final_tokens=num_final,
            logit_gaps=gaps, logprobs=lps, prompt_logprobs=prompt_lps)

    def _draft_batch(self, reqs, rows: torch.Tensor, num_tokens: torch.Tensor, target_end: torch.Tensor,
                     is_drafting: list[bool], target_start: torch.Tensor, hidden: torch.Tensor,
                     num_new_drafts: list[int], sampler=None, shapes: StepShapes | None = None,
                     block_table: torch.Tensor | None = None) -> DraftBatch:
        """The DraftBatch of `reqs` (their depths and num_new_drafts, the drafts each proposes;
        rows beyond len(reqs) are padding: depth 0, not drafting): static with `shapes` and
        block_table (the decode step's columns and modules, the verification's [Bp, num_blocks]
        block table), else dynamic over modules 1..the deepest request's depth."""
        pad, dev = rows.shape[0] - len(reqs), self.device
        depth = torch.tensor([r.draft_depth for r in reqs] + [0] * pad, device=dev)
        drafting = torch.tensor(list(is_drafting) + [False] * pad, device=dev)
        drafts = torch.tensor(list(num_new_drafts) + [0] * pad, device=dev)
        extent = (dict(num_modules=max(r.draft_depth for r in reqs)) if shapes is None else
                  dict(num_modules=shapes.depth, num_columns=shapes.draft_columns, block_table=block_table,
                       catch_up=shapes.catch_up))
        return DraftBatch(rows, num_tokens, target_end, drafting, depth, target_start, hidden,
                          max(num_new_drafts), sampler=sampler, drafts=drafts, **extent)

    def _decode(self, decodes: list[ScheduledDecode], results: dict,
                tree: bool = False) -> tuple[float, float]:
        """The decode step (module doc, shapes by StepShapes), each request proposing its num_new_drafts
        for the next (tree: the tree's, tree_choice.py); returns (verify_s, draft_s): the rest of the step
        and the draft round."""
        verifies_tree, decodes = (False, decodes) if self.choice is None else self.choice.split(decodes)
        if self.tree or verifies_tree:
            return tree_decode(self, decodes, results, propose_tree=self.tree or tree)
        if not decodes:
            return 0.0, 0.0
        t0 = self._now()
        cache, dev, step = self.cache, self.device, self.step
        spent = 0.0 if self.lazy is None else self.lazy.spent[0]
        reqs = [d.request for d in decodes]
        n_host = [r.num_tokens - 1 for r in reqs]
        nd_host = [d.num_draft_tokens for d in decodes]
        new = [d.num_new_drafts for d in decodes]
        drafting = self.speculator is not None and max(new) > 0     # else no module runs (lazy_catch_up.py)
        chain_new = [self.tree_spec.chain_depth[x] for x in new] if tree else new   # its chain round's
        depths = [r.draft_depth for r in reqs]
        shapes = StepShapes.plan([r.num_tokens for r in reqs], nd_host, [d * drafting for d in depths],
                                 [len(r.draft_token_ids) for r in reqs], chain_new,
                                 k=self.num_speculative_tokens,
                                 num_draft_modules=(0 if self.speculator is None
                                                    else self.speculator.num_draft_modules),
                                 block_size=self.block_size, max_blocks=cache.max_blocks,
                                 padded_batch=step.padded_batch(len(reqs)), static=step.static,
                                 depth_buckets=self.config.compile_depths)
        B, T = shapes.batch, shapes.window
        pad = shapes.padded_batch - B
        rows_host = [self.rows[r.index] for r in reqs] + [cache.pad_row] * pad
        rows = torch.tensor(rows_host, device=dev)
        n = torch.tensor(n_host + [0] * pad, device=dev)
        meta = cache.static_meta(n, torch.tensor([1 + x for x in nd_host] + [0] * pad, device=dev),
                                 rows, T, shapes.num_blocks, keep_states=shapes.keep_states)
        meta.row_run = None if step.static else ascending_run(rows_host)
        real = B + sum(nd_host)
        if self._ragged(B * T, real, step.static, T):
            meta.pack_valid([1 + x for x in nd_host], step.packed_tokens(real, shapes.padded_batch * T))
        ids, h, logits = step.verify(meta)
        sampling = self._sampling(reqs)
        target, probs = process_logits(reqs, logits[:B], ids[:B], self.grammars), self._draft_probs
        accepted, emitted = verify(ids[:B], target, nd_host, sampling, [probs.get(r.index) for r in reqs],
                                   *self._verify_with)
        self._commit_states(decodes, n_host, nd_host, rows, accepted, shapes)
        # known tokens x_{n+1 .. n+m+1} = emitted[:, :m+1]; the rest go to the pad row
        keep = torch.arange(T, device=dev)[None] <= accepted[:, None]                  # [B, T]
        cache.write_tokens(torch.where(keep, rows[:B, None], cache.pad_row),
                           n[:B, None] + 1 + torch.arange(T, device=dev), emitted)
        gaps = self._gaps(logits[:B])
        lps = logprobs([r.params.logprobs for r in reqs], logits[:B], emitted)
        t1 = t2 = self._now()
        num_tokens = n[:B] + accepted + 2                                   # known after this step
        final = n[:B] + accepted + 1                                        # target KV final below
        drafts = caps = None
        if drafting:
            if lagging := self.lazy.lagging(rows_host[:len(depths)]):     # modules behind catch up first
                self.lazy.catch_up(rows, rows_host, depths, n_host, lagging)
                t1 += self.lazy.spent[0] - spent
            batch = self._draft_batch(reqs, rows, torch.cat([num_tokens, num_tokens.new_ones(pad)]),
                                      torch.cat([final, final.new_zeros(pad)]), [True] * B,
                                      meta.positions[:, 0], h, new,
                                      self._draft_sampler(sampling, new, reqs, (emitted, accepted)),
                                      shapes, meta.block_table)
            drafts = (self.choice.propose(self, reqs, rows, num_tokens, final, meta.positions[:, 0], h, new)
                      if tree else step.draft(batch))
            final = torch.minimum(final, drafts.num_final[:B])
            t2 = self._now()
        elif self.speculator is not None and max(depths) > 0:       # the modules fall behind
            caps = self.lazy.hold(rows[:B], rows_host, depths, n_host, accepted, h, num_tokens, n)
        self._decode_results(decodes, results, emitted, accepted, final, drafts, shapes, gaps, lps, caps)
        spent = 0.0 if self.lazy is None else self.lazy.spent[0] - spent      # catch-up: StepTiming's own
        return self._now() - t0 - (t2 - t1) - spent, t2 - t1

    def _commit_states(self, decodes, n_host: list[int], nd_host: list[int], rows: torch.Tensor,
                       accepted: torch.Tensor, shapes: StepShapes) -> None:
        """The Gated DeltaNet states after verification: kept at each row's accepted token, and
        the boundary states of the accepted window tokens stored with their blocks (a 1-token
        window stored its state in the forward: only its boundary states are copied)."""
        save = self._boundaries(decodes, n_host, [1 + x for x in nd_host])
        if not shapes.keep_states:
            if save is not None:
                self.cache.save_recurrent_rows(rows[save[0]], save[2])
            return
        if save is not None:      # only the accepted window tokens' states (pad block else)
            bi, ti, blocks = save
            save = (bi, ti, torch.where(ti <= accepted[bi], blocks, self.cache.pad_block))
        self.step.commit(torch.cat([accepted, accepted.new_zeros(shapes.padded_batch - shapes.batch)]), save)

    def _decode_results(self, decodes, results: dict, emitted, accepted, final, drafts: Drafts | None,
                        shapes: StepShapes, gaps, lps, caps: list[int] | None = None) -> None:
        """One RequestResult per decode, from one device -> host transfer of the emitted tokens,
        accepted counts, next drafts and final positions (at most caps[b]: a lagging row's)."""
        B, T, k = shapes.batch, shapes.window, self.num_speculative_tokens
        parts = [emitted, accepted[:, None]]
        if k and drafts is not None:     # a step without drafts: none packed (every request keeps 0)
            parts.append(drafts.tokens[:B])
        parts.append(final[:, None])
        packed = torch.cat(parts, 1).tolist()       # the step's one device -> host transfer
        q = None if drafts is None else drafts.probs
        for b, d in enumerate(decodes):
            row = packed[b]
            m = row[T]
            self._result(results, d, row[: m + 1], d.num_draft_tokens, m, row[T + 1: -1],
                         None if q is None else q[b], row[-1] if caps is None else min(row[-1], caps[b]),
                         gaps[b][: m + 1] if gaps is not None else None,
                         lps[b][: m + 1] if lps is not None and lps[b] is not None else None)
