"""Tree drafting's metrics (mtpx/metrics/tree_metrics.py): the report's tree rows, the sweep
table's tree columns, the W&B scalars and table, and tree_acceptance.png, from a TreeStats
summary with known counts (exact strings and values)."""
from __future__ import annotations

import sys
import types

import pytest

from mtpx.engine.tree_step import TreeStats
from mtpx.metrics.dashboard import write_run_figures
from mtpx.metrics.report import format_report
from mtpx.metrics.tree_metrics import TREE_COLUMNS, tree_report_rows, tree_wandb, write_tree_figure


def _summary() -> dict:
    """10 rounds over 4 steps, 50 nodes; accepted paths: depth 1 by rank 0 six times and rank 1
    twice, depth 2 by rank 0 three times and rank 1 once."""
    s = TreeStats([[0], [1], [0, 0], [0, 1], [1, 0]])
    for nd, depth_rank in [([5, 5, 5], [(0, 0), (1, 0), (0, 1)]), ([5, 5], [(0, 0), (1, 1), (0, 0)]),
                           ([5, 5, 5], [(0, 0), (1, 0), (0, 1)]), ([5, 5], [(0, 0), (1, 0), (0, 0)])]:
        s.record(nd, depth_rank)
    return s.summary()


def test_summary_counts():
    t = _summary()
    assert t["rounds"] == 10 and t["nodes_per_round"] == 5.0 and t["nodes_per_step"] == 12.5
    assert t["accepted_rank_per_depth"] == [[6, 2], [3, 1]]
    assert t["per_depth_acceptance"] == [0.8, 0.4]
    assert t["accepted_path_length"] == pytest.approx(1.2)


def test_report_rows_and_sweep_columns():
    m = {"tree": _summary()}
    assert tree_report_rows(m) == [
        ("Tree: draft nodes verified per round", "5.00"), ("Tree: draft nodes verified per step", "12.50"),
        ("Tree: accepted path length", "1.20"), ("Tree: per-depth acceptance (%)", "80.0 / 40.0"),
        ("Tree: accepted rank per depth (% of accepted)", "d1: 75/25 · d2: 75/25")]
    assert tree_report_rows({}) == []
    report = format_report({"num_requests": 2, "acceptance_length": 2.2, **m}, "t", width=140)
    assert "Tree: per-depth acceptance (%)" in report and "d1: 75/25 · d2: 75/25" in report
    assert [(name, fn(m)) for name, fn in TREE_COLUMNS] == [
        ("Tree nodes / round", "5.00"), ("Accepted path length", "1.20"),
        ("Tree per-depth acceptance (%)", "80.0 / 40.0")]
    assert all(fn({}) is None for _, fn in TREE_COLUMNS)


def test_wandb_scalars_and_table(monkeypatch):
    tables = []

    class Table:
        def __init__(self, columns, data):
            tables.append((columns, data))
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(Table=Table))
    out = tree_wandb({"tree": _summary()})
    assert {k: v for k, v in out.items() if not isinstance(v, Table)} == {
        "tree/nodes_per_round": 5.0, "tree/nodes_per_step": 12.5,
        "tree/accepted_path_length": pytest.approx(1.2),
        "tree/per_depth_acceptance/depth_1": 0.8, "tree/per_depth_acceptance/depth_2": 0.4}
    assert tables == [(["depth", "rank", "count", "share_of_rounds"],
                       [[1, 0, 6, 0.6], [1, 1, 2, 0.2], [2, 0, 3, 0.3], [2, 1, 1, 0.1]])]
    assert tree_wandb({}) == {}


def test_tree_figure_in_the_run_folder(tmp_path):
    paths = write_run_figures({"tree": _summary()}, tmp_path)
    assert [p.name for p in paths] == ["tree_acceptance.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = TreeStats([[0], [1]]).summary()
    assert write_tree_figure({"tree": empty}, tmp_path / "none") == []
