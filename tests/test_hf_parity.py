"""Parity with Hugging Face transformers on tiny random checkpoints written by `save_pretrained`.

For each family in tests/hf_models.py (Qwen3-Next with MoE, Llama, Llama with llama3 RoPE
scaling and biases, Qwen3 with tied embeddings), on a batch of two random 64-token prompts and
32 greedy steps, in float32:
  (a) the checkpoint loaded by `mtpx.hf.loader.load_pretrained` gives, through mtpx's cached
      (incremental) path, prefill logits at all 64 positions and 32 one-token decode-step logits
      equal to transformers' full forward and to `generate`'s per-step logits (atol 1e-4); the
      uncached full forward agrees too;
  (b) `mtpx.LLM(model=folder).generate(prompt_token_ids, SamplingParams(max_tokens=32,
      ignore_eos=True))` emits exactly transformers' greedy tokens.
Speculative decoding is not tested here: these checkpoints carry no MTP heads.
On a failure the message names the first modules whose outputs differ (forward hooks on the
modules both models share by name, `hf_models.module_diffs`).
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers",
                                   reason="parity tests need transformers: pip install -e '.[dev]'")

from tests import hf_models  # noqa: E402  (after the importorskip)

pytestmark = pytest.mark.parity

PROMPT_LEN, NEW_TOKENS, BATCH = 64, 32, 2
ATOL = 1e-4
# model seeds whose greedy outputs are far from ties (top-1 minus top-2 logit >= 0.017) and
# not a single repeated token, for the prompts below (prompt generator seed 0)
SEEDS = {"qwen3_next_moe": 0, "llama": 2, "llama3_rope_bias": 3, "qwen3": 4}
MIN_GAP = 20 * ATOL


class Case:
    """One family's checkpoint and transformers' reference outputs."""

    def __init__(self, name: str, folder, hf):
        self.name, self.folder, self.hf = name, folder, hf
        g = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(0, hf.config.vocab_size, (BATCH, PROMPT_LEN), generator=g)
        self.tokens, self.step_logits = hf_models.hf_greedy(hf, self.prompt, NEW_TOKENS)
        self.sequence = torch.cat([self.prompt, self.tokens], dim=1)      # [B, 96]
        with torch.no_grad():
            self.full_logits = hf(input_ids=self.sequence).logits.float()  # [B, 96, V]
        self._mtpx = None

    @property
    def mtpx(self):
        """The mtpx model loaded from the same folder (once per family)."""
        if self._mtpx is None:
            from mtpx.hf.loader import load_pretrained
            model, _ = load_pretrained(self.folder, dtype=torch.float32)
            self._mtpx = model
        return self._mtpx

    def where(self, logits: torch.Tensor, ref: torch.Tensor, what: str) -> str:
        d = (logits - ref).abs()
        flat = int(d.flatten().argmax())
        idx = list(torch.unravel_index(torch.tensor(flat), d.shape))
        diffs = hf_models.module_diffs(self.hf, self.mtpx, self.sequence)
        return (f"{self.name}: {what}: max |mtpx - transformers| = {d.max().item():.3g} at "
                f"{[int(i) for i in idx]} (atol {ATOL}); first modules over tolerance in the full "
                f"forward:\n{hf_models.format_diffs(diffs, ATOL)}")


@pytest.fixture(scope="module", params=list(SEEDS))
def case(request, tmp_path_factory) -> Case:
    name = request.param
    folder, hf = hf_models.build(name, tmp_path_factory.mktemp(name), SEEDS[name])
    return Case(name, folder, hf)


def test_reference_is_well_conditioned(case):
    """Sanity of the test itself: no greedy step of transformers is within MIN_GAP of a tie,
    so fp32 rounding cannot flip a token, and `generate`'s logits equal its full forward."""
    gap = hf_models.min_top2_gap(case.step_logits)
    assert gap > MIN_GAP, f"{case.name}: greedy top-2 gap {gap:.3g}: pick another seed in SEEDS"
    ref = case.full_logits[:, PROMPT_LEN - 1: PROMPT_LEN - 1 + NEW_TOKENS]
    torch.testing.assert_close(case.step_logits, ref, atol=ATOL, rtol=0)


@torch.no_grad()
def test_full_forward_matches(case):
    """mtpx's uncached forward over prompt + generated tokens equals transformers' forward."""
    logits = case.mtpx(case.sequence).float()
    assert logits.shape == case.full_logits.shape
    ok = torch.allclose(logits, case.full_logits, atol=ATOL, rtol=0)
    assert ok, case.where(logits, case.full_logits, "full forward logits")


@torch.no_grad()
def test_cached_prefill_and_decode_match(case):
    """(a) Prefill (64 positions) and 32 one-token decode steps through the paged cache."""
    from mtpx.cache.model_cache import ModelCache
    m = case.mtpx
    cache = ModelCache(m, rows=BATCH + 1, max_len=PROMPT_LEN + NEW_TOKENS + 8, num_draft_modules=0,
                       block_size=16).static_block_tables()
    rows = torch.tensor([2, 0])                      # rows other than 0..B-1 on purpose
    meta = cache.meta(torch.zeros(BATCH, dtype=torch.long), torch.full((BATCH,), PROMPT_LEN), rows)
    prefill = m.lm_head(m.model(case.prompt, meta, cache.target)).float()     # [B, 64, V]
    steps = []
    for j in range(NEW_TOKENS):                     # feed transformers' token j at position 64 + j
        meta = cache.meta(torch.full((BATCH,), PROMPT_LEN + j), torch.ones(BATCH, dtype=torch.long), rows)
        steps.append(m.lm_head(m.model(case.tokens[:, j: j + 1], meta, cache.target))[:, 0].float())
    decode = torch.stack(steps, dim=1)               # [B, 32, V]: logits at positions 64..95

    ref = case.full_logits[:, :PROMPT_LEN]
    assert torch.allclose(prefill, ref, atol=ATOL, rtol=0), case.where(prefill, ref,
                                                                       "cached prefill vs full forward")
    ref = case.full_logits[:, PROMPT_LEN:]
    assert torch.allclose(decode, ref, atol=ATOL, rtol=0), case.where(decode, ref,
                                                                      "cached decode vs full forward")
    # generate's step j logits (j = 0..31) are those at position 63 + j
    mine = torch.cat([prefill[:, -1:], decode[:, :-1]], dim=1)
    assert torch.allclose(mine, case.step_logits, atol=ATOL, rtol=0), \
        case.where(mine, case.step_logits, "cached logits vs generate's per-step logits")
    assert torch.equal(mine.argmax(-1), case.tokens), f"{case.name}: argmax of the cached logits differs"


def test_llm_greedy_tokens_match(case):
    """(b) mtpx.LLM on the checkpoint folder emits transformers' greedy tokens exactly."""
    from mtpx import LLM, SamplingParams
    llm = LLM(model=str(case.folder), dtype="float32", max_num_seqs=BATCH,
              max_model_len=PROMPT_LEN + NEW_TOKENS + 32)
    outs = llm.generate([p.tolist() for p in case.prompt],
                        SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    for b, out in enumerate(outs):
        assert out.error is None, out.error
        want = case.tokens[b].tolist()
        got = list(out.output_token_ids)
        first = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
        assert got == want, (f"{case.name} prompt {b}: mtpx tokens differ from transformers' "
                             f"first at step {first}: mtpx {got} vs transformers {want}")


def test_bench_tool_smoke(tmp_path):
    """tools/bench_hf_generate.py runs end to end on a tiny setting and writes its table + JSON."""
    import json

    from tools import bench_hf_generate
    threads = torch.get_num_threads()
    try:
        rc = bench_hf_generate.main(["--batch-sizes", "1", "2", "--prompt-len", "8", "--max-new-tokens", "4",
                                     "--repeats", "1", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["batch_size"] for r in data["results"]] == [1, 2]
    assert all(r["tokens_identical"] for r in data["results"])
    assert "| mtpx / transformers |" in (tmp_path / "results.md").read_text()
