"""Calibration of the engine itself: measured decode-step costs per k and batch size, the input
of the cost model (mtpx.metrics.cost_model)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from mtpx.engine.llm import LLM
from mtpx.engine.sampling_params import SamplingParams
from mtpx.metrics.cost_model import step_costs


def calibrate(model, spec: str | None, ks: Sequence[int], batch_sizes: Sequence[int],
              prompt_len: int = 64, steps: int = 12, seed: int = 0, **engine_kwargs) -> list[dict]:
    """Measure the step cost at every (k, B): B requests of `prompt_len` random tokens decode
    together for about `steps` steps (k = 0: plain decoding).

    model: an MTPForCausalLM or checkpoint folder; spec: "mtp1" | "mtp8" for k > 0.
    Returns [{"k", "batch_size", "verify_ms", "draft_ms", "step_ms", "steps"}] (verify_ms of k = 0
    is the plain decode step; draft_ms 0).

    Raises ValueError when no step at some (k, B) decoded every request with k drafts (raise
    `steps`), or for a k the model cannot draft (from LLM).
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in ks:
        llm = LLM(model=model, spec=spec if k else None, num_speculative_tokens=k or None,
                  max_num_seqs=max(batch_sizes), **engine_kwargs)
        vocab = llm.model.cfg.vocab_size
        for b in batch_sizes:
            prompts = [torch.randint(2, vocab, (prompt_len,), generator=g).tolist() for _ in range(b)]
            # every request runs >= steps rounds even if every draft is accepted
            params = SamplingParams(max_tokens=(steps + 2) * (k + 1), ignore_eos=True)
            llm.generate(prompts, params)
            costs = step_costs(llm.engine.step_timings, k).get(b)
            if costs is None:
                raise ValueError(f"k={k}, batch {b}: no step decoded all {b} requests with {k} drafts; raise steps")
            out.append({"k": k, "batch_size": b, **costs})
    return out
