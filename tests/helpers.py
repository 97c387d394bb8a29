"""Helpers shared by the test modules: tiny models, draft checks, a dynamic draft round."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

import pytest

from mtpx import LLM, SamplingParams
from mtpx.schema import data_dir
from mtpx.models import ModelConfig, MTPForCausalLM
from mtpx.spec_decode.protocol import DraftBatch


def tiny_config(**overrides) -> ModelConfig:
    """A tiny hybrid (DeltaNet, attention, DeltaNet, attention) with 4 MTP modules, vocab 64."""
    base = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, full_attention_interval=2, num_nextn_predict_layers=4,
                max_position_embeddings=256)
    base.update(overrides)
    return ModelConfig(**base)


def peaked_model(cfg: ModelConfig, seed: int = 0) -> MTPForCausalLM:
    """A float64 random model whose outputs are sharp enough that drafts often match the target
    (a scaled-up lm_head makes argmaxes depend on few dims that the draft modules share)."""
    torch.manual_seed(seed)
    m = MTPForCausalLM(cfg).double().eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(20)
    return m


def _synthetic_batch(g: torch.Generator, B: int, T: int) -> torch.Tensor:
    """Arithmetic sequences mod 60 (+ a noise token now and then): predictable several tokens ahead."""
    start = torch.randint(2, 62, (B, 1), generator=g)
    step = torch.randint(1, 4, (B, 1), generator=g)
    x = (start + step * torch.arange(T)) % 60 + 2
    noise = torch.rand(B, T, generator=g) < 0.1
    return torch.where(noise, torch.randint(2, 64, (B, T), generator=g), x)


# the dense-target conventions of Hugging Face Llama (mtpx.hf.config.FAMILIES)
LLAMA_FLAGS = dict(model_type="llama", layer_types=["full_attention"] * 4, attn_output_gate=False,
                   use_qk_norm=False, rms_norm_unit_offset=False, partial_rotary_factor=1.0)


def train_tiny(**overrides) -> MTPForCausalLM:
    """tiny_config(**overrides) trained jointly for 15 steps on arithmetic sequences, in float64."""
    torch.manual_seed(0)
    model = MTPForCausalLM(tiny_config(**overrides))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(15):  # few steps: drafts are accepted about half the time
        loss, _ = model.training_losses(_synthetic_batch(g, 16, 48), mtp_loss_weight=0.5)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.double().eval()


# the data directory the data-dependent tests read (MTPX_DATA_DIR, else conf/config.yaml's
# data_dir); tests that need one of its files skip when it is absent
DATA_DIR = data_dir(Path(__file__).resolve().parents[1] / "conf")



def propose(speculator, cache, rows, num_tokens, target_meta, hidden, is_drafting=None):
    """One draft round with dynamic metadata (what the runner does after a prefill chunk):
    Speculator.propose over the target's newly computed positions (target_meta, hidden
    [B, T, H]); is_drafting defaults to every row. -> drafts [B, k]."""
    if is_drafting is None:
        is_drafting = torch.ones_like(rows, dtype=torch.bool)
    depth = torch.full_like(rows, speculator.num_speculative_tokens)
    batch = DraftBatch(rows, num_tokens, target_meta.ends, is_drafting, depth, target_meta.positions[:, 0],
                       hidden)
    return speculator.propose(cache, batch).tokens


def install_proposal_check(llm, reference) -> list:
    """Wrap the engine's runner.execute: every proposal in its RunnerOutput is compared with
    `reference(seq, got)`, the drafts computed from scratch over the request's tokens `seq` after
    the step (got: the proposal). Returns the list of (ok, seq, got, want) it fills."""
    runner = llm.engine.runner
    execute, checked = runner.execute, []

    def checked_execute(out):
        result = execute(out)
        for item in out.prefills + out.decodes:
            r, res = item.request, result.results[item.request.index]
            if res.draft_token_ids:
                seq, got = r.all_token_ids + res.token_ids, res.draft_token_ids
                want = reference(seq, got)
                checked.append((got == want, seq, got, want))
        return result

    runner.execute = checked_execute
    return checked


def install_draft_check(llm, model, spec: str, k: int) -> list:
    """install_proposal_check with the chain speculators' from-scratch drafts (tests.test_reprefill).
    Equal drafts imply the draft-module KV and hidden states the modules read were exact."""
    def reference(seq, got):
        assert len(got) <= k
        return (_reference_multi(model, seq, got, len(got)) if spec == "mtp8"   # auto k: fewer
                else _reference_single(model, seq, len(got)))
    return install_proposal_check(llm, reference)


# ---- engines checked against plain greedy decoding ------------------------------------------------
FINISHED = {"stop", "length"}
GAP_TOL = 1e-5   # logit gaps are float32 (ModelRunner._gaps): a few ulps of the logits


def _params(max_tokens: int, stop: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                          stop_token_ids=[] if stop is None else [stop])


def spy(monkeypatch, obj, name: str) -> list:
    """Record the positional arguments of every call of obj.name (which still runs) for the
    test's duration; returns the list they are appended to."""
    calls, method = [], getattr(obj, name)

    def recorded(*args, **kwargs):
        calls.append(args)
        return method(*args, **kwargs)

    monkeypatch.setattr(obj, name, recorded)
    return calls


def make_llm(model, spec=None, k=None, **kw) -> LLM:
    kw.setdefault("check_invariants", True)
    kw.setdefault("record_logit_gaps", True)
    return LLM(model=model, spec=spec, num_speculative_tokens=k, **kw)


def lookahead(spec, k) -> int:
    return 0 if spec is None else 1 if spec == "mtp1" else k


def blocks_needed(prompt_len: int, max_tokens: int, k: int, block_size: int) -> int:
    """The worst-case blocks the engine reserves a request for (Engine.add_request)."""
    return -(-(prompt_len + max_tokens + 2 * k + 2) // block_size)


def assert_clean(llm: LLM) -> None:
    eng = llm.engine
    assert not eng.scheduler.has_work()
    assert eng.kv.num_free_blocks == eng.config.num_blocks, "KV blocks leaked"
    assert eng.cache.num_free_rows() == eng.config.max_num_seqs, "batch slots leaked"
    eng.kv.check_invariants()


def generate(llm: LLM, prompts, params, on_step=None, allow_errors=False):
    """-> (output token lists, outputs, {index: Request}); asserts that every request finished
    (stop or length) and that nothing leaked."""
    reqs = {}
    outs = llm.generate(prompts, params, on_finish=lambda r: reqs.__setitem__(r.index, r),
                        on_step=on_step)
    assert_clean(llm)
    if not allow_errors:
        for o in outs:
            assert o.error is None, o.error
            assert o.finish_reason in FINISHED, (o.index, o.finish_reason)
        assert sorted(reqs) == list(range(len(prompts)))
    return [o.output_token_ids for o in outs], outs, reqs


_REF: dict = {}


def _reference(model, prompts, params) -> list[tuple[list[int], list[float]]]:
    """Plain greedy decoding with the defaults (no prefix caching, a pool that never preempts):
    (tokens, top-2 logit gaps) per prompt, memoized per (model, prompt, max_tokens, stop ids)."""
    keys = [(id(model), tuple(p), sp.max_tokens, tuple(sp.stop_token_ids))
            for p, sp in zip(prompts, params)]
    todo = sorted({i for i, key in enumerate(keys) if key not in _REF})
    if todo:
        llm = LLM(model=model, check_invariants=True, record_logit_gaps=True)
        _, outs, _ = generate(llm, [prompts[i] for i in todo], [params[i] for i in todo])
        for i, o in zip(todo, outs):
            _REF[keys[i]] = (o.output_token_ids, o.logit_gaps)
    return [_REF[key] for key in keys]


def reference(model, prompts, params) -> list[list[int]]:
    return [list(t) for t, _ in _reference(model, prompts, params)]


def assert_matches_reference(model, outs, prompts, params) -> None:
    """Tokens exactly equal to plain greedy decoding, and (engines built by make_llm record them)
    the top-2 logit gap of every token equal up to float64 rounding: the gaps also expose state
    errors (e.g. a wrong Gated DeltaNet state) too small to flip an argmax."""
    ref = _reference(model, prompts, params)
    assert [o.output_token_ids for o in outs] == [t for t, _ in ref]
    for o, (_, gaps) in zip(outs, ref):
        assert o.logit_gaps == pytest.approx(gaps, rel=GAP_TOL, abs=GAP_TOL), o.index


def run_checked(llm: LLM, model, prompts, params, on_step=None):
    """generate + assert_matches_reference -> (outputs, {index: Request})."""
    _, outs, reqs = generate(llm, prompts, params, on_step=on_step)
    assert_matches_reference(model, outs, prompts, params)
    return outs, reqs


# ---- drafts from scratch -------------------------------------------------------------------------
def _reference_single(model, seq, k):
    """mtp1's k drafts from scratch: the module over positions 0..n-1, then extended one position
    at a time on (previous draft, previous output)."""
    n = len(seq) - 1
    x = torch.tensor([seq])
    hid = model.model(x)[:, :n]
    emb = model.model.embed_tokens(x[:, 1:])
    a = model.mtp[0](emb, hid, torch.arange(n)[None])
    want = []
    for _ in range(k):
        d = int(model.lm_head(a[0, -1]).argmax())
        want.append(d)
        emb = torch.cat([emb, model.model.embed_tokens(torch.tensor([[d]]))], 1)
        hid = torch.cat([hid, a[:, -1:]], 1)
        a = model.mtp[0](emb, hid, torch.arange(hid.shape[1])[None])
    return want


def _reference_multi(model, seq, drafts, k):
    n = len(seq) - 1
    full = torch.tensor([seq + drafts[: k - 1]])
    chain = model.mtp_chain(full, model.model(full), k)
    return [int(model.lm_head(chain[i][0, n - 1]).argmax()) for i in range(k)]


def sigterm_after(reads: int):
    """A mtpx.io.GracefulInterrupt whose `reads`-th check of `requested` sends this process a
    real SIGTERM first (handled by the real handler), for in-process SIGTERM tests."""
    import os
    import signal
    import time

    from mtpx.io import GracefulInterrupt

    class SigtermAfter(GracefulInterrupt):
        count = 0

        @property
        def requested(self):
            SigtermAfter.count += 1
            if SigtermAfter.count == reads:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):            # the handler runs at the next bytecode boundary
                    if self._flag:
                        break
                    time.sleep(0.001)
            return self._flag

        @requested.setter
        def requested(self, value):
            self._flag = value

    return SigtermAfter


def python_calls(fn) -> int:
    """Python frames entered while fn() runs (C calls not counted)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event == "call"
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count
