"""Run figures, W&B charts, the dashboard and sweep tools, and the transformers peer comparison
(mtpx/metrics/dashboard.py, tools/dashboard.py, tools/sweep_table.py, tools/compare_hf.py)."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml

from mtpx.metrics.analytics import analytics
from mtpx.metrics.dashboard import RUN_FIGURES, format_position0_prediction, load_run, write_run_figures
from mtpx.metrics.logging import RunLogger
from mtpx.metrics.sweep import collect_sweep

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"

# hand-made per-round records (num_draft_tokens, num_accepted, num_committed) of three requests, k = 3
ROUNDS = [[(3, 3, 4), (3, 1, 2), (3, 0, 1), (3, 2, 3)], [(3, 0, 1), (3, 3, 4), (3, 3, 4)],
          [(2, 2, 3), (3, 1, 2)]]


def _tool(name):
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metrics(categories, rounds=ROUNDS, k=3, **extra):
    a = analytics(rounds, categories, k)
    m = {"num_requests": len(rounds), "num_failed": 0, "acceptance_rate": 0.6, "acceptance_length": 2.5,
         "per_position_acceptance": a["per_position"]["unconditional"], "analytics": a}
    return {**m, **extra}


def test_write_run_figures(tmp_path):
    written = write_run_figures(_metrics(["code", "gsm8k", "code"]), tmp_path / "a")
    assert [p.name for p in written] == list(RUN_FIGURES)
    assert all(p.read_bytes()[:8] == PNG for p in written)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(RUN_FIGURES)  # no temp files

    one = write_run_figures(_metrics(["code"] * 3), tmp_path / "b")  # one category: no category figure
    assert [p.name for p in one] == ["acceptance_conditional.png", "position0_buckets.png"]
    assert not (tmp_path / "b" / "acceptance_by_category.png").exists()
    plain = {"num_requests": 3, "per_position_acceptance": []}  # no speculation: nothing to draw
    assert write_run_figures(plain, tmp_path / "c") == [] and not (tmp_path / "c").exists()


def test_run_figures_of_automatic_k(tmp_path):
    """num_speculative_tokens=auto: the k and depth histograms and the cost model's predicted vs
    measured speed-up per batch size follow the acceptance figures; a bucket without compared
    steps is not drawn, and without one at all there is no cost-model figure."""
    from mtpx.metrics.cost_model_figure import AUTO_K_FIGURES
    row = {"decode_steps": 5, "steps": 4, "predicted_speedup": 1.2, "measured_speedup": 1.1,
           "plain_step_ms_source": "calibrated", "plain_steps": 0}
    auto_k = {"k_histogram": {"0": 2, "3": 6}, "depth_histogram": {"3": 3},
              "cost_model": {"1": row, "4-7": dict(row, plain_step_ms_source="measured", plain_steps=2),
                             "16-31": {"decode_steps": 1, "steps": 0}},
              "acceptance_by_age": [{"output_tokens": "0-7", "conditional_acceptance": [0.6, 0.7],
                                     "verified": [9.5, 0.4]},
                                    {"output_tokens": "32+", "conditional_acceptance": [0.7, 0.7],
                                     "verified": [0.0, 0.0]}]}
    written = write_run_figures(_metrics(["code"] * 3, auto_k=auto_k), tmp_path / "a")
    assert ([p.name for p in written]
            == ["acceptance_conditional.png", "position0_buckets.png", *AUTO_K_FIGURES])
    assert all(p.read_bytes()[:8] == PNG for p in written)
    no_steps = dict(auto_k, cost_model={"16-31": {"decode_steps": 1, "steps": 0}})
    assert [p.name for p in write_run_figures(_metrics(["code"] * 3, auto_k=no_steps),
                                              tmp_path / "b")][2:] == \
        ["auto_k_histograms.png", "acceptance_by_age.png"]
    unseen = dict(no_steps,
                  acceptance_by_age=[dict(r, verified=[0.0, 0.0]) for r in auto_k["acceptance_by_age"]])
    assert [p.name for p in write_run_figures(_metrics(["code"] * 3, auto_k=unseen), tmp_path / "c")][2:] == \
        ["auto_k_histograms.png"]                        # no bucket with a verified draft: no age figure


def test_wandb_charts_over_the_analytics_tables():
    pytest.importorskip("wandb")
    a = _metrics(["code", "gsm8k", "code"])["analytics"]
    tables = RunLogger._analytics_tables(a)
    charts = RunLogger._analytics_charts(a, tables)
    assert set(charts) == {"analytics/per_position_chart", "analytics/position0_chart",
                           "analytics/by_category_chart"}
    assert charts["analytics/position0_chart"].table is tables["analytics/position0_buckets"]
    one = analytics(ROUNDS, ["code"] * 3, 3)
    assert set(RunLogger._analytics_charts(one, RunLogger._analytics_tables(one))) == {
        "analytics/per_position_chart", "analytics/position0_chart"}
    assert RunLogger._analytics_charts(None, {}) == {}


def test_position0_prediction_text():
    a = {"after_rejection": {"rate": 0.704}, "after_full": {"rate": 0.857}}
    b = {"share_after_rejection": 0.771, "total": {"rate": 0.756}}
    assert format_position0_prediction("MTP1", a, "MTP8", b) == (
        "predicted MTP8 position-0 from MTP1's conditional rates: "
        "0.771 x 0.704 + 0.229 x 0.857 = 0.739; measured 0.756")
    empty = {"after_rejection": {"rate": None}, "after_full": {"rate": 0.9}}
    assert format_position0_prediction("A", empty, "B", b) == (
        "predicted B position-0 from A's conditional rates: undefined (a bucket is empty); measured 0.756")


def _run_dir(path: Path, metrics: dict | None, overrides: list[str], config: dict | None = None) -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if config is not None:
        (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    if metrics is not None:
        (path / "metrics.json").write_text(json.dumps(metrics))
    return path


def test_dashboard_tool(tmp_path, capsys):
    # position 0 after a rejection / after a full round / share of rounds after a rejection:
    # mtp1 (k=1) 2/3, 1/2, 3/5; mtp8 k=3 (ROUNDS) 2/3, 3/3, 3/6
    mtp1 = _metrics(["code"] * 2, [[(1, 1, 2), (1, 0, 1), (1, 1, 2), (1, 1, 2)],
                                          [(1, 0, 1), (1, 0, 1), (1, 1, 2)]], k=1,
                    output_throughput=100.0, median_tpot_ms=10.0)
    mtp8 = _metrics(["code", "gsm8k", "code"], output_throughput=80.0, median_tpot_ms=12.0)
    plain = {"num_requests": 3, "num_failed": 0, "per_position_acceptance": [], "output_throughput": 120.0,
             "median_tpot_ms": 8.0}
    a = _run_dir(tmp_path / "a", mtp1, ["+spec=mtp1"],
                 {"spec": {"method": "mtp1", "num_speculative_tokens": 1}})
    b = _run_dir(tmp_path / "b", mtp8, ["+spec=mtp8"],
                 {"spec": {"method": "mtp8", "num_speculative_tokens": None}})
    c = _run_dir(tmp_path / "c", plain, [], {"eval": {}})
    assert ((load_run(b).name, load_run(b).k, load_run(c).name, load_run(c).method)
            == ("mtp8 k=3", 3, "no spec", None))

    dashboard = _tool("dashboard")
    assert dashboard.main([str(a), str(b), str(c), "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "predicted mtp8 k=3 position-0 from mtp1's conditional rates: 0.500 x 0.667 + 0.500 x 0.500 = 0.583; "
        "measured 0.833",
        "predicted mtp1 position-0 from mtp8 k=3's conditional rates: 0.600 x 0.667 + 0.400 x 1.000 = 0.800; "
        "measured 0.600",
    ]
    names = {"per_position_acceptance.png", "position0_buckets.png", "throughput_vs_k.png",
             "acceptance_by_category.png", "summary.md"}
    assert {p.name for p in (tmp_path / "d").iterdir()} == names
    summary = (tmp_path / "d" / "summary.md").read_text()
    assert ("| Metric | mtp1 | mtp8 k=3 | no spec |" in summary
            and "- predicted mtp8 k=3 position-0" in summary)

    unfinished = _run_dir(tmp_path / "e", None, ["+spec=mtp8"])  # a run dir without metrics.json
    assert dashboard.main([str(a), str(unfinished)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {unfinished}/metrics.json not found")
    assert dashboard.main([str(a), str(b), "--names", "x"]) == 2
    assert "2 run directories" in capsys.readouterr().err


def test_sweep_table(tmp_path, capsys):
    """Four jobs: two finished (one with a lossless mismatch), one without metrics.json, one never
    started (the sweep stopped): the exact markdown table and problem list."""
    root = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    common = ["eval.num_prompts=4", "logger=none"]
    jobs = [["+spec=mtp1", "spec.num_speculative_tokens=1"], ["+spec=mtp1", "spec.num_speculative_tokens=2"],
            ["+spec=mtp8", "spec.num_speculative_tokens=1"], ["+spec=mtp8", "spec.num_speculative_tokens=2"]]
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {
        "sweep": {"dir": str(root), "subdir": "${hydra.job.num}"},
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"},
        "overrides": {"task": ["+spec=mtp1,mtp8", "spec.num_speculative_tokens=1,2", *common]}}}))
    base = {"num_requests": 4, "num_failed": 0, "median_ttft_ms": 130.0, "median_itl_ms": 20.5}
    _run_dir(root / "0", {**base, "acceptance_rate": 0.7353, "acceptance_length": 1.7353,
                          "per_position_acceptance": [0.7353], "output_throughput": 211.584,
                          "median_tpot_ms": 9.49, "lossless_mismatches": 0}, jobs[0] + common)
    _run_dir(root / "1", {**base, "num_failed": 1, "acceptance_rate": 0.6154, "acceptance_length": 2.1923,
                          "per_position_acceptance": [0.7778, 0.4074], "output_throughput": 204.4,
                          "median_tpot_ms": None, "lossless_mismatches": 1}, jobs[1] + common)
    _run_dir(root / "2", None, jobs[2] + common)

    sweep_table = _tool("sweep_table")
    assert sweep_table.main([str(root), "--out", str(tmp_path / "sweep.md")]) == 0
    expected = f"""# Sweep {root}

4 job(s), 2 with metrics, 3 with problems.

Common overrides: `eval.num_prompts=4` `logger=none`

| spec | spec.num_speculative_tokens | Acceptance rate (%) | Acceptance length | Per-position acceptance (%) \
| Output tok/s | Median TTFT (ms) | Median TPOT (ms) | Median ITL (ms) | Lossless mismatches | Job |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
| mtp1 | 1 | 73.53 | 1.74 | 73.5 | 211.58 | 130.00 | 9.49 | 20.50 | 0 | 0 |
| mtp1 | 2 | 61.54 | 2.19 | 77.8 / 40.7 | 204.40 | 130.00 | — | 20.50 | 1 | 1 |

## Failed or incomplete jobs

- job 1 (`+spec=mtp1 spec.num_speculative_tokens=2`): lossless check failed: 1 request(s) differ from plain \
decoding (the job exited with status 1); 1 of 4 requests failed (their error is in outputs.jsonl)
- job 2 (`+spec=mtp8 spec.num_speculative_tokens=1`): no metrics.json: the job stopped before writing it \
(killed, or a crash with a traceback on the sweep's stderr), or is still running
- job 3 (`+spec=mtp8 spec.num_speculative_tokens=2`): not started: the sweep was stopped before this job \
(a failed job does not stop it: train_or_eval.py runs the next one), or is still running
"""
    assert (tmp_path / "sweep.md").read_text() == expected
    assert capsys.readouterr().out.startswith(expected)
    failed = _run_dir(tmp_path / "other" / "0", None, ["+spec=mtp8"])  # the reason from the job's log
    (failed / "train_or_eval.log").write_text("[2026-01-01][mtpx][ERROR] - error: boom\n")
    assert collect_sweep(tmp_path / "other")[0].problems == [
        "failed before writing metrics.json: [2026-01-01][mtpx][ERROR] - error: boom"]
    assert sweep_table.main([str(tmp_path / "empty")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_compare_hf_smoke(tmp_path, capsys):
    """The peer comparison end to end on a tiny dense (Llama-convention) mtpx checkpoint with 4 MTP
    modules: every row runs (prompt lookup included: the exported target is a LlamaForCausalLM) and
    mtpx's greedy tokens equal transformers'."""
    pytest.importorskip("transformers", reason="tools/compare_hf.py compares against transformers")
    from mtpx.train.checkpoint import save_checkpoint
    from mtpx.train.tokenizer import train_tokenizer
    from tests.helpers import LLAMA_FLAGS, peaked_model, tiny_config

    tok = train_tokenizer(["Question: what is 2 + 3?\nAnswer: 5\n" * 50, "def f(x):\n    return x\n" * 50],
                          300)
    model = peaked_model(tiny_config(vocab_size=tok.get_vocab_size(), **LLAMA_FLAGS)).float()
    save_checkpoint(tmp_path / "ckpt", model, tok)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n"
                            for q in ["what is 2 + 3?", "what is 4 + 4 + 4?"]))
    torch_threads = torch.get_num_threads()
    compare_hf = _tool("compare_hf")
    code = compare_hf.main(["--checkpoint", str(tmp_path / "ckpt"), "--data", "gsm8k", "--data-path",
                            str(data), "--num-prompts", "2", "--max-new-tokens", "4",
                            "--prompt-lookup-num-tokens", "2", "--out", str(tmp_path / "out")])
    assert torch.get_num_threads() == torch_threads
    assert code == 0, capsys.readouterr()
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(r["engine"], r["setting"], r["batch_size"]) for r in res["rows"]] == [
        ("transformers", "greedy", 1), ("transformers", "prompt lookup 2", 1), ("mtpx", "no spec", 1),
        ("mtpx", "mtp1 (k=1)", 1), ("mtpx", "mtp8 (k=4)", 1)]
    assert all(r["error"] is None and r["mean_output_tok_per_s"] > 0 for r in res["rows"])
    assert res["rows"][0]["ratio_to_transformers_greedy"] == 1.0
    assert res["greedy_check"]["identical"] == 2 and res["greedy_check"]["mismatches"] == []
    assert [r["prompts_identical_to_transformers_greedy"] for r in res["rows"]] == [2] * 5
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| mtpx | mtp8 (k=4) | 1 |" in md and "identical on 2/2 prompts" in md


def test_figures_carry_the_run_identity_and_failed_categories(tmp_path):
    """Titles name model, spec, k, data set and prompts; a category whose requests all failed is
    drawn (marked) instead of dropped; mixed data sets or modes get a warning."""
    from mtpx.metrics.dashboard import Run, mixed_runs_warning, run_identity
    m = _metrics(["code", "gsm8k", "code"])
    m["run"] = {"model": "/x/checkpoints/demo", "spec": "mtp8", "num_speculative_tokens": 3, "data": "gsm8k",
                "num_prompts": 3, "mode": "eval"}
    assert run_identity(m) == "demo · mtp8 k=3 · gsm8k · 3 prompts"
    assert run_identity({**m, "partial": True}).endswith("(interrupted)")
    m["analytics"]["by_category"]["writing"] = {"num_requests": 2, "num_failed": 2, "num_drafts": 0,
                                                "acceptance_rate": None, "acceptance_length": None,
                                                "per_position_acceptance": [None] * 3}
    written = write_run_figures(m, tmp_path)
    assert [p.name for p in written] == list(RUN_FIGURES) and all(p.read_bytes()[:8] == PNG for p in written)
    runs = [Run(Path("a"), "a", {"run": {"data": "gsm8k", "mode": "eval"}}, "mtp8", 3),
            Run(Path("b"), "b", {"run": {"data": "humaneval", "mode": "bench"}}, None, 0)]
    assert mixed_runs_warning(runs) == ("warning: these runs mix data sets (gsm8k, humaneval) and modes "
                                        "(bench, eval): their throughput and acceptance do not compare")
    assert mixed_runs_warning(runs[:1]) is None


def test_loss_curve_has_one_legend_entry_per_depth(tmp_path):
    from mtpx.train.loop import plot_loss_curve
    history = [{"step": s, "split": split, "main": 3.0 - s / 10,
                **{f"mtp{k}": 3.1 - s / 10 for k in range(1, 9)}}
               for s in range(1, 6) for split in ("train", "val")]
    plot_loss_curve(history, tmp_path / "loss.png", 8)
    assert (tmp_path / "loss.png").read_bytes()[:8] == PNG


def test_loss_curve_names_the_run(tmp_path):
    from omegaconf import OmegaConf

    from mtpx.io import source_commit
    from mtpx.models.config import ModelConfig
    from mtpx.train.loop import loss_curve_identity
    t = OmegaConf.create({"data_sources": ["gsm8k", "stdlib:0.5"], "steps": 200})
    line = loss_curve_identity(Path("/x/ds_heads"), ModelConfig(num_hidden_layers=4, hidden_size=64,
                                                                num_nextn_predict_layers=8,
                                                                mtp_style="deepseek_v3"), t, 100)
    assert line.startswith("ds_heads · 4 layers x 64, 8 MTP modules (deepseek_v3) · data gsm8k,stdlib:0.5 · "
                           "step 100 of 200 · 20") and " UTC · commit " + source_commit()[:9] in line


def _capture_figures(monkeypatch):
    """The matplotlib Figures the dashboard saves, by file name (drawn on an Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import mtpx.metrics.dashboard as dash
    figs = {}

    def save(fig, path):
        FigureCanvasAgg(fig)
        fig.canvas.draw()
        figs[Path(path).name] = fig
        return Path(path)
    monkeypatch.setattr(dash, "_save", save)
    return figs


def test_wilson_interval_solves_the_score_equation():
    """Each bound p solves (x/n - p)^2 = z^2 p (1 - p) / n (Wilson's score interval), inside [0, 1]."""
    from mtpx.metrics.analytics import wilson_interval
    z = 1.96
    for x, n in ((0, 5), (5, 5), (3, 6), (81, 263), (1, 4)):
        lo, hi = wilson_interval(x, n)
        assert 0 <= lo < x / n < hi <= 1 or (x in (0, n) and lo <= x / n <= hi)
        for p in (lo, hi):
            if 0 < p < 1:
                assert abs((x / n - p) ** 2 - z * z * p * (1 - p) / n) < 1e-12
    assert wilson_interval(0, 5)[1] == pytest.approx(z * z / (5 + z * z))
    assert wilson_interval(3, 0) is None


def test_run_figures_carry_date_commit_intervals_and_explain_colours(tmp_path, monkeypatch):
    """acceptance_conditional.png: 95% Wilson intervals on every conditional bar (positions
    reached by a handful of rounds too), the legend below the axes (it hides no bar); the
    position-0 buckets' colours are in a legend; every title names the date and the commit."""
    from mtpx.metrics.analytics import wilson_interval
    figs = _capture_figures(monkeypatch)
    m = _metrics(["code", "gsm8k", "code"])
    m["run"] = {"model": "/x/checkpoints/demo", "spec": "mtp8", "num_speculative_tokens": 3, "data": "gsm8k",
                "num_prompts": 3, "mode": "eval", "date": "2026-12-03T16:40:05Z",
                "commit": "04292ad1f2f3c4b5a6978877665544332211aabb+dirty"}
    write_run_figures(m, tmp_path)
    title = "demo · mtp8 k=3 · gsm8k · 3 prompts · 2026-12-03 16:40 UTC · commit 04292ad1f+dirty"
    assert {f._suptitle.get_text() for f in figs.values()} == {title}
    fig = figs["acceptance_conditional.png"]
    (ax,) = fig.axes
    pp = m["analytics"]["per_position"]
    assert pp["reached"] == [9, 7, 4]                      # few rounds reach the last positions
    (errorbars,) = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    segments = errorbars.lines[2][0].get_segments()
    expected = [wilson_interval(a, n) for a, n in zip(pp["accepted"], pp["reached"])]
    assert len(segments) == 3
    for seg, (lo, hi) in zip(segments, expected):
        assert seg[0][1] == pytest.approx(lo * 100) and seg[1][1] == pytest.approx(hi * 100)
    (legend,) = fig.legends
    assert legend.get_window_extent().y1 <= ax.get_window_extent().y0      # below the axes
    assert "95% Wilson interval" in " ".join(t.get_text() for t in legend.get_texts())
    (bax,) = figs["position0_buckets.png"].axes
    texts = [t.get_text() for t in bax.get_legend().get_texts()]
    assert texts[:3] == ["first round (no previous round)",
                         "previous round ended in a rejection (0 .. k-1 accepted)",
                         "previous round accepted every draft"] \
        and texts[3].startswith("every round after the first")
    assert bax.get_legend().get_window_extent().y1 <= bax.get_window_extent().y0
    # a position never accepted (interval [0, high]) and positions never reached (no interval)
    zero = _metrics(["code"], rounds=[[(3, 0, 1)] * 4], k=3)
    assert write_run_figures(zero, tmp_path / "zero")[0].name == "acceptance_conditional.png"


def test_throughput_vs_k_never_joins_two_runs_of_one_k(tmp_path, monkeypatch):
    from mtpx.metrics.dashboard import Run, k_series, write_comparison_figures

    def run(name, k, data, tok_s, overrides=()):
        return Run(Path(name), name, {"run": {"data": data, "mode": "eval"}, "output_throughput": tok_s,
                                      "median_tpot_ms": 1000 / tok_s}, "mtp8", k, None,
                   [*overrides, f"spec.num_speculative_tokens={k}"])
    a2, a4, a8 = run("a2", 2, "gsm8k", 50.0), run("a4", 4, "gsm8k", 60.0), run("a8", 8, "gsm8k", 70.0)
    h8 = run("h8", 8, "humaneval", 40.0)
    series = k_series([a2, a4, a8, h8])
    assert {label: [r.name for r in rs] for label, rs in series.items()} == {
        "mtp8 (gsm8k, eval)": ["a2", "a4", "a8"], "mtp8 (humaneval, eval)": ["h8"]}
    again = run("a8 again", 8, "gsm8k", 65.0)          # a repeat at k = 8: points of their own
    assert {label: [r.name for r in rs] for label, rs in k_series([a2, a8, again]).items()} == {
        "a2": ["a2"], "a8": ["a8"], "a8 again": ["a8 again"]}
    assert list(k_series([a2, a4])) == ["mtp8"]
    figs = _capture_figures(monkeypatch)
    write_comparison_figures([a2, a4, a8, h8, again], tmp_path)
    for ax in figs["throughput_vs_k.png"].axes:
        for line in ax.get_lines():
            xs = list(line.get_xdata())
            assert len(xs) == len(set(xs)), line.get_label()


def test_comparison_buckets_explain_the_colours_once(tmp_path, monkeypatch):
    from mtpx.metrics.dashboard import Run, write_comparison_figures
    figs = _capture_figures(monkeypatch)
    runs = [Run(Path(n), n, _metrics(["code"] * 3), "mtp8", 3) for n in ("a", "b")]
    write_comparison_figures(runs, tmp_path)
    fig = figs["position0_buckets.png"]
    from mtpx.io import source_commit
    assert {f._suptitle.get_text().split(" · ")[0] for f in figs.values()} == {"runs: a, b"}
    assert all(f" UTC · commit {source_commit()[:9]}" in f._suptitle.get_text() for f in figs.values())
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "first round (no previous round)", "previous round ended in a rejection (0 .. k-1 accepted)",
        "previous round accepted every draft"]
    assert all(legend.get_window_extent().y1 <= ax.get_window_extent().y0 for ax in fig.axes)
    assert [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes] == [
        ["every round after the first: 83.3%"]] * 2
