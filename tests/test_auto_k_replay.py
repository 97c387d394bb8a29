"""Automatic k's decisions identical on a replayed trace (issue 67): tests/data/auto_k_trace.json
holds four traces' step inputs (each round's accepted drafts, each step's timing parts) and the
decisions the code before automatic k's package made on them (commit 6c6300f; tests/auto_k_trace.py
records them); the current code replays the inputs and must decide the same: every step's k, the
depth of every admitted request, every running depth that fell, the drafts each decode verifies.
c16_per_request was recorded again after the tie rule of issue 72 (AutoDraftLength._landing: the
cheaper k wins a tie): its first step admitted request 1 at depth 3, not 4 (3's goodput on upper
estimates came within the hysteresis of the highest), and the run went on at k = 3 where it ran
k = 4; the other three traces replay the recorded code's decisions unchanged."""
import json
from pathlib import Path

import pytest

from tests import auto_k_trace

TRACE = json.loads((Path(__file__).parent / "data" / "auto_k_trace.json").read_text())


@pytest.mark.parametrize("name", sorted(auto_k_trace.SCENARIOS))
def test_decisions_identical_on_the_recorded_trace(name):
    inputs, decisions = auto_k_trace.run(name, TRACE[name]["inputs"])
    expected = TRACE[name]["decisions"]
    assert len(decisions) == len(expected)
    for step, (got, want) in enumerate(zip(decisions, expected)):
        assert got == want, f"{name}: step {step} decided {got}, the recorded code {want}"


def test_the_traces_hold_what_the_decisions_turn_on():
    """Probes, a fall of the k in use, depths below max_k, a running depth that fell and a
    per-request allocation verifying fewer drafts than held: a trace that never decides these
    would pass whatever the code decides."""
    ks = {name: {s["k"] for s in TRACE[name]["decisions"]} for name in TRACE}
    assert all(len(v) >= 2 for v in ks.values())
    depths = {d for name in TRACE for s in TRACE[name]["decisions"] for _, d in s["admitted"]}
    assert min(depths) < auto_k_trace.MAX_K and len(depths) >= 3
    assert any(s["lowered"] for s in TRACE["c4"]["decisions"])
    held = [n for s in TRACE["c16_per_request"]["decisions"] for _, n in s["verified"]]
    assert len(set(held)) >= 3
