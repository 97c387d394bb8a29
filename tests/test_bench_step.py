"""tools/bench_step.py on the demo checkpoint, eager, one batch size: a row per spec with the
engine step, the forwards timed alone and their ratio, also paired call by call."""
from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_step_smoke(tmp_path, tiny_ckpt):
    spec = importlib.util.spec_from_file_location("_bench_step", ROOT / "tools" / "bench_step.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    # --threads 1: the tool's default of 2 threads would oversubscribe the machine beside the
    # other pytest-xdist worker (this test took 49 s alone and 131 s under `-n 2`); the count
    # is incidental to what is checked here
    assert tool.main(["--specs", "none", "mtp1", "mtp8", "--modes", "eager", "--batch-sizes", "2",
                      "--steps", "3", "--repeats", "2", "--mtp1-k", "2", "--threads", "1",
                      "--model", str(tiny_ckpt), "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench_step.json").read_text())["rows"]
    # tiny_ckpt: 4 MTP modules
    assert ([(r["spec"], r["k"], r["batch_size"]) for r in rows]
            == [("none", 0, 2), ("mtp1", 2, 2), ("mtp8", 4, 2)])
    for r in rows:
        assert r["step_ms"] > 0 and r["target_k1_ms"] > 0 and r["target_1_ms"] > 0
        assert r["overhead"] == r["step_ms"] / r["forwards_ms"]
        assert ("draft_loop_ms" in r) == (r["k"] > 0)
        pairs = r["paired_ms"]                   # (step, forwards) ms, alternated call by call
        assert len(pairs) == 2 and all(a > 0 and b > 0 for a, b in pairs)
        assert r["step_over_forwards_paired"] == statistics.median(a / b for a, b in pairs)
        assert r["paired_step_ms"] == statistics.median(a for a, _ in pairs)
    assert "| mtp8 | 4 | eager | 2 |" in (tmp_path / "bench_step.md").read_text()
