"""The target's window masks reuse the draft round's (mtpx/structured/masks.py, drafts.py): the
mask that chose draft i + 1 is the target's mask of column i in the next window, so each grammar
state's mask is filled once per step, and the tokens stay plain decoding's under the same
constraints. test_window_columns_follow_the_drafts (tests/test_structured_output.py) checks every
column's mask, reused or filled, against a fresh matcher's."""
from mtpx import LLM
from mtpx.structured import drafts as drafts_mod
from mtpx.structured import masks as masks_mod
from tests.test_structured_output import tiny_plain  # noqa: F401 (fixture)


class _Counting:
    """batch_matcher() with its fills counted (rows filled per call)."""

    def __init__(self, inner, calls: list):
        self.inner, self.calls = inner, calls

    def batch_fill_next_token_bitmask(self, matchers, bitmask, indices):
        self.calls.append(len(indices))
        return self.inner.batch_fill_next_token_bitmask(matchers, bitmask, indices)


def test_each_state_is_filled_once_per_step(trained_tiny, tiny_plain, monkeypatch):  # noqa: F811
    """mtp8 with k = 4: a decode step's target fills at most one column per constrained row
    (mostly none: the draft round filled the window's last column too), where it filled every
    column (up to k + 1) before; the other columns are the draft round's masks; the tokens equal
    plain decoding's."""
    target_fills, draft_fills, steps = [], [], []
    inner = drafts_mod.batch_matcher()
    monkeypatch.setattr(masks_mod, "batch_matcher", lambda: _Counting(inner, target_fills))
    monkeypatch.setattr(drafts_mod, "batch_matcher", lambda: _Counting(inner, draft_fills))
    apply = masks_mod.GrammarMasks.apply

    def recording(self, reqs, logits, raw, drafts=None):
        before, masked = len(target_fills), self.num_masked
        out = apply(self, reqs, logits, raw, drafts)
        if drafts is not None and any(drafts):
            rows = sum(r.grammar is not None for r in reqs)
            steps.append((rows, sum(target_fills[before:]), self.num_masked - masked))
        return out
    monkeypatch.setattr(masks_mod.GrammarMasks, "apply", recording)
    tok, reqs, plain = tiny_plain
    llm = LLM(model=trained_tiny, tokenizer=tok, spec="mtp8", num_speculative_tokens=4, max_num_seqs=8)
    outs = llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    assert len(steps) > 10
    for rows, filled, masked in steps:
        assert filled <= rows < masked, (rows, filled, masked)     # one fill a row, several columns
    masks = llm.engine.runner.grammars
    assert masks.num_filled == sum(target_fills) and masks.num_draft_filled == sum(draft_fills)
    assert masks.num_filled + masks.num_reused == masks.num_masked
    assert masks.num_reused > 2 * masks.num_filled > 0, (masks.num_reused, masks.num_filled)
