"""Helpers shared by the test modules."""
from __future__ import annotations

import torch


def propose(speculator, cache, rows, num_tokens, target_meta, hidden, is_drafting=None):
    """One draft round with dynamic metadata (what the runner does after a prefill chunk):
    plan + draft_loop over the target's newly computed positions (target_meta, hidden
    [B, T, H]); is_drafting defaults to every row. -> drafts [B, k]."""
    if is_drafting is None:
        is_drafting = torch.ones_like(rows, dtype=torch.bool)
    metas = speculator.plan(cache, rows, num_tokens, target_meta.ends, is_drafting)
    return speculator.draft_loop(cache, metas, rows, num_tokens - 1, target_meta.positions[:, 0], hidden)


def install_draft_check(llm, model, spec: str, k: int) -> list:
    """Wrap the engine's runner.execute: every proposal in its RunnerOutput is compared with the
    drafts computed from scratch over the request's tokens after the step (tests.test_reprefill).
    Equal drafts imply the draft-module KV and hidden states the modules read were exact.
    Returns the list of (ok, seq, got, want) it fills."""
    from tests.test_reprefill import _reference_multi, _reference_single
    runner = llm.engine.runner
    execute, checked = runner.execute, []

    def checked_execute(out):
        result = execute(out)
        for item in out.prefills + out.decodes:
            r, res = item.request, result.results[item.request.index]
            if not res.draft_token_ids:
                continue
            seq = r.all_token_ids + res.token_ids
            got = res.draft_token_ids
            want = (_reference_multi(model, seq, got, k) if spec == "mtp8"
                    else _reference_single(model, seq, k))
            checked.append((got == want, seq, got, want))
        return result

    runner.execute = checked_execute
    return checked
