"""Acceptance analytics on hand-written round records: exact expected tables."""
import pytest

from mtpx import LLM, SamplingParams
from mtpx.metrics.analytics import analytics, by_category, per_position, position0_buckets, predict_position0

# k = 3; (num_draft_tokens, num_accepted, num_committed) per round, one list per request.
A = [(3, 3, 4), (3, 1, 2), (3, 0, 1), (2, 2, 3), (3, 3, 4)]   # (2, 2, 3): a budget-limited round
B = [(3, 0, 1), (3, 2, 3)]
C = [(1, 1, 1)]                                               # stopped at its accepted draft


def test_per_position_unconditional_and_conditional():
    pp = per_position([A, B, C], 3)
    assert pp["num_rounds"] == 8
    assert pp["accepted"] == [6, 4, 2]
    assert pp["reached"] == [8, 5, 3]        # position i verified: > i drafts and the first i accepted
    assert pp["unconditional"] == [6 / 8, 4 / 8, 2 / 8]
    assert pp["conditional"] == [6 / 8, 4 / 5, 2 / 3]
    with pytest.raises(ValueError, match="accepted <= drafts <= k=3"):
        per_position([[(3, 4, 5)]], 3)


def test_position0_buckets_by_previous_round():
    b = position0_buckets([A, B, C], 3)
    rows = {r["prev_accepted"]: (r["count"], r["accepted"], r["rate"]) for r in b["rows"]}
    assert rows == {0: (2, 2, 1.0), 1: (1, 0, 0.0), 2: (0, 0, None), "all": (2, 2, 1.0)}
    assert b["first_round"] == {"count": 3, "accepted": 2, "rate": 2 / 3}
    assert b["after_rejection"] == {"count": 3, "accepted": 2, "rate": 2 / 3}
    assert b["after_full"] == {"count": 2, "accepted": 2, "rate": 1.0}
    assert b["total"] == {"count": 5, "accepted": 4, "rate": 0.8}
    assert b["share_after_rejection"] == 3 / 5


def test_mtp1_buckets_are_rejected_and_accepted():
    """k = 1: the buckets are the reference's '0 (draft rejected)' and '1 (draft accepted)'."""
    rounds = [(1, 1), (1, 1), (1, 0), (1, 1), (1, 0), (1, 0), (1, 1)]
    b = position0_buckets([rounds], 1)
    rows = {r["prev_accepted"]: (r["count"], r["accepted"]) for r in b["rows"]}
    # prev accepted -> this one: 1->1, 1->0, 0->1, 1->0, 0->0, 0->1
    assert rows == {0: (3, 2), "all": (3, 1)}


def test_predict_position0_reproduces_the_reference_arithmetic():
    """The reference: MTP8's mix (77.1% of position-0 drafts after a rejection) with MTP1's
    conditional rates (70.4% after a rejection, 85.7% after an acceptance)."""
    mtp1 = {"after_rejection": {"rate": 0.704}, "after_full": {"rate": 0.857}}
    mtp8 = {"share_after_rejection": 0.771, "total": {"rate": 0.7557}}
    p = predict_position0(mtp1, mtp8)
    assert p["predicted"] == pytest.approx(0.771 * 0.704 + 0.229 * 0.857, abs=1e-12)
    assert p["formula"] == "0.771 x 0.704 + 0.229 x 0.857 = 0.739"
    assert p["measured"] == 0.7557
    empty = {"after_rejection": {"rate": None}, "after_full": {"rate": 0.9}}
    assert predict_position0(empty, mtp8)["predicted"] is None


def test_by_category():
    cats = by_category([A, B, C], ["math", "code", "math"], 3)
    assert list(cats) == ["math", "code"]
    m = cats["math"]
    assert ((m["num_requests"], m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"])
            == (2, 6, 15, 10))
    assert m["num_committed_tokens"] == 15
    assert m["acceptance_rate"] == 10 / 15 and m["acceptance_length"] == 15 / 6   # C committed 1
    assert m["per_position_acceptance"] == [5 / 6, 3 / 6, 2 / 6]
    assert cats["code"]["acceptance_rate"] == 2 / 6
    with pytest.raises(ValueError, match="3 requests but 2 categories"):
        by_category([A, B, C], ["a", "b"], 3)


def test_engine_rounds_agree_with_the_counters(trained_tiny):
    """The per-round records the engine keeps sum to the request's counters."""
    llm = LLM(model=trained_tiny, spec="mtp8", num_speculative_tokens=4)
    outs = llm.generate([[5, 8, 11, 14], [20, 21], [40, 42, 44]],
                        SamplingParams(max_tokens=30, ignore_eos=True))
    for o in outs:
        s = o.spec
        assert len(s.rounds) == s.num_drafts > 0
        assert sum(d for d, _, _ in s.rounds) == s.num_draft_tokens
        assert sum(a for _, a, _ in s.rounds) == s.num_accepted_tokens
        assert sum(c for _, _, c in s.rounds) == s.num_committed_tokens
        assert (per_position([s.rounds], 4)["accepted"]
                == s.accepted_per_position + [0] * (4 - len(s.accepted_per_position)))
    a = analytics([o.spec.rounds for o in outs], ["x", "y", "x"], 4)
    assert a["position0_buckets"]["first_round"]["count"] == 3
    assert a["by_category"]["x"]["num_requests"] == 2
