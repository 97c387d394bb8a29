"""Metrics arithmetic on hand-written traces, report tables, logging, plots and atomic writes."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpx.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from mtpx.metrics import (
    METRIC_KEYS,
    RequestOutput,
    RunLogger,
    SpecDecodeCounts,
    aggregate_spec,
    compute_metrics,
    format_comparison,
    format_report,
    plot_per_position_acceptance,
)

K = 3  # num_speculative_tokens of the hand-written trace


def _request(index, rounds, n_out, arrival, first, finish, error=None, emissions=(), prompt_len=3,
             cached=0, preemptions=0):
    spec = SpecDecodeCounts()
    for r in rounds:
        spec.record_round(*r)
    return RequestOutput(
        index=index,
        prompt_token_ids=list(range(prompt_len)),
        output_token_ids=list(range(n_out)),
        text="x",
        finish_reason=None if error else "length",
        spec=spec,
        arrival_time=arrival,
        first_token_time=first,
        finish_time=finish,
        error=error,
        num_cached_tokens=cached,
        num_preemptions=preemptions,
        emission_times=list(emissions),
    )


def _trace() -> list[RequestOutput]:
    """4 requests, k=3. Expected totals worked out by hand in test_compute_metrics_trace."""
    return [
        # drafts 3, draft tokens 9, accepted 4, per position [2, 1, 1]; TTFT 200 ms, TPOT 1 s / 10;
        # 11 tokens in 4 emissions: ITLs 250, 250, 500 ms
        _request(0, [(3, 3), (3, 1), (3, 0)], 11, 10.0, 10.2, 11.2,
                 emissions=[10.2, 10.45, 10.7, 11.2]),
        # the 0-draft round records nothing; drafts 2, tokens 5, accepted 4, per position [2, 2];
        # the last round stops at its first accepted draft: committed 3 + 1 (not 3 + 3)
        # 1 output token: TTFT 100 ms, no TPOT, one emission: no ITL
        _request(1, [(3, 2), (0, 0), (2, 2, 1)], 1, 10.5, 10.6, 10.6, emissions=[10.6]),
        # failed: its rounds count (drafts 1, tokens 3, accepted 1), its tokens and times do not
        _request(2, [(3, 1)], 7, 10.0, 10.1, None, error="boom", emissions=[10.1, 10.6]),
        # plain decoding: no rounds; TTFT 400 ms, TPOT 1 s / 4 = 250 ms; ITL 1000 ms
        _request(3, [], 5, 11.0, 11.4, 12.4, emissions=[11.4, 12.4]),
    ]


def test_record_round_counts():
    s = SpecDecodeCounts()
    s.record_round(3, 3)
    s.record_round(3, 1)
    s.record_round(0, 0)
    s.record_round(3, 0)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 9, 4)
    assert s.accepted_per_position == [2, 1, 1]


def test_record_round_committed_tokens():
    """A round that accepts 3 drafts of 4 but stops at the second commits 2 tokens and no bonus
    (vLLM #56101): raw counters keep the verifier's 3, acceptance length counts 2."""
    s = SpecDecodeCounts()
    s.record_round(4, 3, 2)
    s.record_round(4, 1)                     # an ordinary round: 1 draft + the bonus token
    assert (s.num_drafts, s.num_accepted_tokens, s.num_committed_tokens) == (2, 4, 4)
    assert s.accepted_per_position == [2, 1, 1]
    assert s.rounds == [(4, 3, 2), (4, 1, 2)]
    assert s.acceptance_length == 2.0
    assert SpecDecodeCounts().acceptance_length is None


@pytest.mark.parametrize("args", [(-1, 0), (2, -1), (2, 3), (0, 1), (3, 1, 3), (3, 1, 0)])
def test_record_round_rejects_bad_counts(args):
    with pytest.raises(ValueError, match="record_round"):
        SpecDecodeCounts().record_round(*args)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n)))))
def test_record_round_invariants(rounds):
    s = SpecDecodeCounts()
    for n, a in rounds:
        s.record_round(n, a)
    assert s.num_drafts == sum(1 for n, _ in rounds if n > 0)
    assert sum(s.accepted_per_position) == s.num_accepted_tokens
    assert all(x >= y for x, y in zip(s.accepted_per_position, s.accepted_per_position[1:]))
    assert all(x <= s.num_drafts for x in s.accepted_per_position)


def test_aggregate_spec_sums_all_requests():
    total = aggregate_spec(_trace())
    assert total == SpecDecodeCounts(6, 17, 9, [5, 3, 1], num_committed_tokens=7 + 4 + 2)


def test_compute_metrics_trace():
    m = compute_metrics(_trace(), duration_s=2.0, num_speculative_tokens=K)
    assert list(m) == list(METRIC_KEYS)
    assert m["num_requests"] == 4
    assert m["num_failed"] == 1
    assert (m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"]) == (6, 17, 9)
    assert m["acceptance_rate"] == 9 / 17
    assert m["num_committed_tokens"] == 13
    assert m["acceptance_length"] == 13 / 6       # not 1 + 9 / 6: one round stopped early
    assert m["per_position_acceptance"] == [5 / 6, 3 / 6, 1 / 6]
    assert m["output_throughput"] == (11 + 1 + 5) / 2.0  # the failed request's 7 tokens excluded
    assert m["mean_ttft_ms"] == pytest.approx((200 + 100 + 400) / 3)
    assert m["mean_tpot_ms"] == pytest.approx((100 + 250) / 2)
    # ITLs pooled over successful requests: [250, 250, 500, 1000]
    assert m["mean_itl_ms"] == pytest.approx(2000 / 4)
    assert m["median_itl_ms"] == pytest.approx((250 + 500) / 2)
    assert m["p99_itl_ms"] == pytest.approx(500 + 0.97 * (1000 - 500))  # rank 0.99 * 3 = 2.97
    # E2EL of the successful requests: 1200, 100, 1400 ms
    assert m["mean_e2el_ms"] == pytest.approx((1200 + 100 + 1400) / 3)
    assert m["median_e2el_ms"] == pytest.approx(1200)
    assert m["median_ttft_ms"] == pytest.approx(200) and m["median_tpot_ms"] == pytest.approx(175)
    # p99 by linear interpolation: TTFTs [100, 200, 400] rank 1.98, TPOTs [100, 250] rank 0.99,
    # E2ELs [100, 1200, 1400] rank 1.98
    assert m["p99_ttft_ms"] == pytest.approx(200 + 0.98 * 200)
    assert m["p99_tpot_ms"] == pytest.approx(100 + 0.99 * 150)
    assert m["p99_e2el_ms"] == pytest.approx(1200 + 0.98 * 200)
    assert m["request_throughput"] == 3 / 2.0
    assert m["duration_s"] == 2.0
    assert m["lossless_mismatches"] is None
    assert (m["num_prompt_tokens"], m["num_cached_tokens"]) == (9, 0)  # 3 successful x 3 tokens
    assert m["prefix_cache_hit_rate"] is None  # prefix caching off
    assert m["num_preemptions"] == 0


def test_itl_counts_emissions_not_tokens():
    """Several tokens accepted in one step are one emission: ITL is the gap between emissions.
    Dyadic times, so every value is exact."""
    outs = [
        # 9 tokens in 4 emissions: ITLs 250, 250, 500 ms (its TPOT is 1 s / 8 = 125 ms)
        _request(0, [], 9, 0.5, 1.0, 2.0, emissions=[1.0, 1.25, 1.5, 2.0]),
        _request(1, [], 2, 2.5, 3.0, 3.125, emissions=[3.0, 3.125]),  # ITL 125 ms
        _request(2, [], 1, 4.5, 5.0, 5.0, emissions=[5.0]),  # one emission: no ITL
        _request(3, [], 2, 0.0, 0.0, None, error="boom", emissions=[0.0, 4.0]),  # failed: left out
    ]
    m = compute_metrics(outs, 1.0, 0)
    assert m["mean_itl_ms"] == (125 + 250 + 250 + 500) / 4 == 281.25
    assert m["median_itl_ms"] == 250.0
    assert m["p99_itl_ms"] == pytest.approx(250 + 0.97 * (500 - 250))  # rank 0.99 * 3 = 2.97
    assert m["mean_tpot_ms"] == (125 + 125) / 2


def test_latency_medians_e2el_and_request_throughput():
    """vLLM benchmark_serving's definitions on dyadic times (exact values): E2EL = finish -
    arrival, TPOT = (E2EL - TTFT) / (output tokens - 1) for > 1 token, request throughput =
    successful requests / duration; failed requests are left out of all of them."""
    outs = [
        _request(0, [], 5, 0.0, 0.25, 1.25),  # TTFT 250, E2EL 1250, TPOT 1000 / 4 = 250
        _request(1, [], 3, 1.0, 1.5, 1.75),  # TTFT 500, E2EL 750, TPOT 250 / 2 = 125
        _request(2, [], 1, 2.0, 2.125, 2.125),  # TTFT 125, E2EL 125, one token: no TPOT
        _request(3, [], 3, 0.5, 1.5, 3.5),  # TTFT 1000, E2EL 3000, TPOT 2000 / 2 = 1000
        _request(4, [], 9, 0.0, 0.5, None, error="boom"),  # failed
    ]
    m = compute_metrics(outs, 4.0, 0)
    assert m["request_throughput"] == 4 / 4.0 == 1.0
    assert m["output_throughput"] == (5 + 3 + 1 + 3) / 4.0
    assert m["mean_ttft_ms"] == (250 + 500 + 125 + 1000) / 4 == 468.75
    assert m["median_ttft_ms"] == (250 + 500) / 2
    assert m["mean_tpot_ms"] == pytest.approx((250 + 125 + 1000) / 3)
    assert m["median_tpot_ms"] == 250.0
    assert m["mean_e2el_ms"] == (1250 + 750 + 125 + 3000) / 4 == 1281.25
    assert m["median_e2el_ms"] == (750 + 1250) / 2
    assert m["p99_ttft_ms"] == pytest.approx(500 + 0.97 * 500)  # [125, 250, 500, 1000] rank 2.97
    assert m["p99_tpot_ms"] == pytest.approx(250 + 0.98 * 750)  # [125, 250, 1000] rank 1.98
    assert m["p99_e2el_ms"] == pytest.approx(1250 + 0.97 * 1750)  # [125, 750, 1250, 3000]
    text = format_report(m, "latencies")
    for label, value in [("Median TTFT (ms)", "375.00"), ("Median TPOT (ms)", "250.00"),
                         ("Mean E2EL (ms)", "1281.25"), ("Median E2EL (ms)", "1000.00"),
                         ("Request throughput (req/s)", "1.00"), ("P99 TTFT (ms)", "985.00"),
                         ("P99 TPOT (ms)", "985.00"), ("P99 E2EL (ms)", "2947.50")]:
        line = next(x for x in text.splitlines() if label in x)
        assert line.split()[-1] == value, line
    none = compute_metrics([_request(0, [], 3, 0.0, 0.1, None, error="oom")], 1.0, 0)
    assert none["request_throughput"] == 0.0
    assert all(none[k] is None for k in ("median_ttft_ms", "median_tpot_ms", "mean_e2el_ms",
                                         "median_e2el_ms", "p99_ttft_ms", "p99_tpot_ms",
                                         "p99_e2el_ms"))


def test_p99_latencies_exact():
    """101 successful requests in shuffled order: the 99th percentile's rank is 0.99 x 100 = 99,
    exactly the 100th smallest value (no interpolation), and every time is dyadic, so p99 and
    median are exact. A failed request with a huge latency is left out."""
    import random
    unit = 1 / 1024  # s; request i has TTFT (i+1) units, TPOT (i+1) units (3 tokens), E2EL 3(i+1)
    outs = []
    for i in range(101):
        arrival = float(i)
        first = arrival + (i + 1) * unit
        outs.append(_request(i, [], 3, arrival, first, first + 2 * (i + 1) * unit))
    random.Random(0).shuffle(outs)
    outs.append(_request(101, [], 3, 0.0, 500.0, 900.0, error="boom"))
    m = compute_metrics(outs, 10.0, 0)
    ms = unit * 1000  # one unit in ms, 0.9765625
    assert (m["p99_ttft_ms"], m["p99_tpot_ms"], m["p99_e2el_ms"]) == (100 * ms, 100 * ms, 300 * ms)
    assert (m["median_ttft_ms"], m["median_tpot_ms"], m["median_e2el_ms"]) == (51 * ms, 51 * ms, 153 * ms)
    assert m["mean_ttft_ms"] == pytest.approx(51 * ms) and m["num_failed"] == 1


def test_compare_runs_shows_the_reference_rows(tmp_path, capsys):
    """tools/compare_runs.py on two metrics.json files: every row of the reference's
    temperature-1 table, in its order of appearance within our rows, with a Δ."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "tools" / "compare_runs.py"
    spec = importlib.util.spec_from_file_location("compare_runs", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    a = compute_metrics(_trace(), 2.0, K)
    b = dict(a, median_e2el_ms=a["median_e2el_ms"] * 2, request_throughput=1.0)
    for name, m in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        atomic_write_json(tmp_path / name / "metrics.json", m)
    assert tool.main([f"MTP1={tmp_path / 'a'}", f"MTP8={tmp_path / 'b'}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    labels = {line.split(" | ")[0][2:] for line in lines[2:]}
    reference = ["Benchmark duration (s)", "Request throughput (req/s)",
                 "Output token throughput (tok/s)", "Median TTFT (ms)", "Median TPOT (ms)",
                 "Median ITL (ms)", "Median E2EL (ms)", "Acceptance rate (%)", "Acceptance length",
                 "Draft tokens", "Accepted tokens", "Per-position acceptance (%) — Pos 0"]
    assert set(reference) <= labels
    assert "| Request throughput (req/s) | 1.50 | 1.00 | -33.3% |" in lines
    assert "| Median E2EL (ms) | 1200.00 | 2400.00 | +100.0% |" in lines


def test_prefix_cache_hit_rate_and_preemptions():
    outs = [
        _request(0, [], 2, 0.0, 0.1, 0.2, prompt_len=8, cached=0),
        _request(1, [], 2, 0.0, 0.1, 0.2, prompt_len=12, cached=8, preemptions=2),
        _request(2, [], 2, 0.0, 0.1, 0.2, prompt_len=20, cached=16),
        # failed: its prompt and cached tokens are left out, its preemption still happened
        _request(3, [], 2, 0.0, 0.1, None, error="boom", prompt_len=100, cached=96, preemptions=1),
    ]
    on = compute_metrics(outs, 1.0, 0, enable_prefix_caching=True)
    assert (on["num_cached_tokens"], on["num_prompt_tokens"]) == (24, 40)
    assert on["prefix_cache_hit_rate"] == 24 / 40 == 0.6
    assert on["num_preemptions"] == 3
    off = compute_metrics(outs, 1.0, 0)
    assert off["prefix_cache_hit_rate"] is None and off["num_preemptions"] == 3
    none_ok = compute_metrics(outs[3:], 1.0, 0, enable_prefix_caching=True)
    assert none_ok["prefix_cache_hit_rate"] is None and none_ok["num_prompt_tokens"] == 0
    assert "60.00% (24 / 40 tokens)" in format_report(on, "on")


def test_compute_metrics_pads_positions_to_k():
    outs = [_request(0, [(4, 1)], 3, 0.0, 0.1, 0.3)]
    m = compute_metrics(outs, 1.0, num_speculative_tokens=4)
    assert m["per_position_acceptance"] == [1.0, 0.0, 0.0, 0.0]


def test_compute_metrics_without_drafts():
    outs = [_request(0, [], 3, 0.0, 0.1, 0.3)]
    m = compute_metrics(outs, 1.0, num_speculative_tokens=2)
    assert m["acceptance_rate"] is None and m["acceptance_length"] is None
    assert m["per_position_acceptance"] == [None, None]
    assert compute_metrics(outs, 1.0, 0)["per_position_acceptance"] == []


def test_compute_metrics_all_failed():
    m = compute_metrics([_request(0, [], 3, 0.0, 0.1, None, error="oom")], 1.0, 0)
    assert (m["num_failed"], m["output_throughput"]) == (1, 0.0)
    assert m["mean_ttft_ms"] is None and m["mean_tpot_ms"] is None
    assert m["mean_itl_ms"] is None and m["median_itl_ms"] is None and m["p99_itl_ms"] is None


def test_compute_metrics_rejects_bad_input():
    with pytest.raises(ValueError, match="duration_s"):
        compute_metrics(_trace(), 0.0, K)
    with pytest.raises(ValueError, match="num_speculative_tokens=2"):
        compute_metrics(_trace(), 1.0, 2)  # the trace accepted a draft at position 2


def test_format_report_shows_numbers():
    m = compute_metrics(_trace(), 2.0, K)
    m.update(accuracy=0.5, num_correct=2, custom_metric=0.25)
    text = format_report(m, "GSM8K mtp3")
    for expected in [
        "GSM8K mtp3", "3 / 1", "50.00% (2/4)", "52.94", "2.17", "17", "13", "83.3 / 50.0 / 16.7",
        "233.33", "175.00", "500.00", "375.00", "985.00", "8.50", "2.00", "custom_metric", "0.25",
    ]:
        assert expected in text, expected
    assert "Lossless" not in text  # None -> row left out
    hit = next(x for x in text.splitlines() if "Prefix cache hit rate" in x)
    assert hit.rstrip().endswith("—")  # prefix caching off
    assert "num_cached_tokens" not in text and "num_prompt_tokens" not in text  # in the hit-rate row


def test_format_report_prefix_cache_hit_rate_in_reference_format():
    m = {"prefix_cache_hit_rate": 716_992 / 852_381, "num_cached_tokens": 716_992,
         "num_prompt_tokens": 852_381}
    line = next(x for x in format_report(m, "t").splitlines() if "Prefix cache hit rate" in x)
    assert line.split()[-5:] == ["84.12%", "(716,992", "/", "852,381", "tokens)"]


def test_format_comparison_prefix_caching_off_vs_on():
    """The reference's first table: the same run with prefix caching off and on, side by side."""
    off = compute_metrics(_trace(), 2.0, K)
    on = dict(off, prefix_cache_hit_rate=0.75, num_cached_tokens=6, num_preemptions=2,
              mean_ttft_ms=off["mean_ttft_ms"] / 2)
    lines = format_comparison({"Prefix Caching OFF": off, "Prefix Caching ON": on}).splitlines()
    assert lines[0] == "| Metric | Prefix Caching OFF | Prefix Caching ON | Δ |"
    labels = [line.split(" | ")[0][2:] for line in lines[2:]]
    reference = ["Successful / failed requests", "Acceptance rate (%)", "Acceptance length",
                 "Per-position acceptance (%) — Pos 0", "Prefix cache hit rate", "Mean TTFT (ms)",
                 "Mean TPOT (ms)", "Output token throughput (tok/s)", "Benchmark duration (s)"]
    assert [x for x in labels if x in reference] == reference  # every row, in the reference order
    assert "| Prefix cache hit rate | — | 75.00% (6 / 9 tokens) | — |" in lines
    assert "| Preemptions | 0 | 2 | — |" in lines  # relative change from 0 is undefined
    assert "| Mean TTFT (ms) | 233.33 | 116.67 | -50.0% |" in lines
    both = format_comparison({"a": on, "b": dict(on, prefix_cache_hit_rate=0.5, num_cached_tokens=4)})
    assert "| Prefix cache hit rate | 75.00% (6 / 9 tokens) | 50.00% (4 / 9 tokens) | -25.00 pts |" \
        in both.splitlines()


def test_format_report_dashes_for_none():
    m = compute_metrics([_request(0, [], 1, 0.0, 0.1, 0.1)], 1.0, 2)
    text = format_report(m, "plain")
    line = next(x for x in text.splitlines() if "Acceptance rate" in x)
    assert line.rstrip().endswith("—")
    assert "— / —" in text  # per-position acceptance without drafts


def test_format_comparison_markdown():
    a = compute_metrics(_trace(), 2.0, K)
    b = dict(a, acceptance_rate=0.5, per_position_acceptance=[0.9], duration_s=1.0)
    text = format_comparison({"MTP 3": a, "MTP 1": b})
    lines = text.splitlines()
    assert lines[0] == "| Metric | MTP 3 | MTP 1 | Δ |"
    assert lines[1] == "| --- | ---: | ---: | ---: |"
    assert "| Acceptance rate (%) | 52.94 | 50.00 | -2.94 pts |" in lines
    assert "| Per-position acceptance (%) — Pos 0 | 83.33 | 90.00 | +6.67 pts |" in lines
    assert "| Per-position acceptance (%) — Pos 2 | 16.67 | — | — |" in lines
    assert "| Benchmark duration (s) | 2.00 | 1.00 | -50.0% |" in lines
    three = format_comparison({"a": a, "b": b, "c": a})
    assert three.splitlines()[0] == "| Metric | a | b | c |"
    with pytest.raises(ValueError):
        format_comparison({})


def test_logger_none_is_noop(tmp_path):
    for cfg in (None, {"name": "none"}):
        log = RunLogger(cfg, tmp_path)
        assert not log.enabled
        log.log({"a": 1}, step=0)
        log.log_metrics_summary({"acceptance_rate": 0.5})
        log.finish()
    assert list(tmp_path.iterdir()) == []


def test_logger_rejects_bad_config(tmp_path):
    with pytest.raises(ValueError, match="logger=NAME"):
        RunLogger({"name": "tensorboard"}, tmp_path)
    with pytest.raises(ValueError, match="logger.mode"):
        RunLogger({"name": "wandb", "mode": "sometimes"}, tmp_path)
    with pytest.raises(ValueError, match="logger.dir"):
        RunLogger({"name": "wandb"}, None)


def test_logger_wandb_offline_writes_run(tmp_path):
    pytest.importorskip("wandb")
    from omegaconf import OmegaConf

    start = time.monotonic()
    cfg = OmegaConf.create({"name": "wandb", "project": "mtpx-test", "mode": "offline", "dir": None})
    log = RunLogger(cfg, tmp_path, run_name="unit", config=OmegaConf.create({"spec": {"k": K}}))
    assert log.enabled
    log.log({"loss": 1.5}, step=0)
    log.log_metrics_summary(compute_metrics(_trace(), 2.0, K))
    log.finish()
    log.finish()  # second call is a no-op
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert time.monotonic() - start < 20


def test_plot_per_position_acceptance(tmp_path):
    a = compute_metrics(_trace(), 2.0, K)
    runs = {"mtp3": a, "mtp1": {"per_position_acceptance": [0.8]}}
    path = plot_per_position_acceptance(runs, tmp_path / "p" / "acc.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["acc.png"]  # no temp file left
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_per_position_acceptance({"plain": {"per_position_acceptance": []}}, tmp_path / "x.png")


def test_atomic_writes_round_trip(tmp_path):
    atomic_write_text(tmp_path / "new" / "a.txt", "héllo")
    assert (tmp_path / "new" / "a.txt").read_text(encoding="utf-8") == "héllo"
    atomic_write_json(tmp_path / "m.json", {"x": [1, None]})
    assert json.loads((tmp_path / "m.json").read_text()) == {"x": [1, None]}
    atomic_write_jsonl(tmp_path / "r.jsonl", [{"i": 0}, {"i": 1}])
    assert [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()] == [{"i": 0}, {"i": 1}]
    (tmp_path / "plain.txt").write_text("x")  # same permissions as an ordinary new file
    assert (tmp_path / "m.json").stat().st_mode == (tmp_path / "plain.txt").stat().st_mode


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "m.json"
    atomic_write_json(path, {"ok": 1})
    with pytest.raises(TypeError, match="m.json"):
        atomic_write_json(path, {"bad": object()})
    with pytest.raises(ValueError, match="NaN"):
        atomic_write_json(path, {"bad": math.nan})
    with pytest.raises(TypeError, match="row 1"):
        atomic_write_jsonl(path, [{"ok": 1}, {"bad": {1, 2}}])

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_text(path, "new content")
    assert json.loads(path.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # temp files cleaned up


def test_format_report_p99_rows_in_reference_order():
    labels = [line.strip().split("  ")[0] for line in format_report(compute_metrics(_trace(), 2.0, K), "t")
              .splitlines()]
    order = ["Median TTFT (ms)", "P99 TTFT (ms)", "Median TPOT (ms)", "P99 TPOT (ms)", "Median ITL (ms)",
             "P99 ITL (ms)", "Median E2EL (ms)", "P99 E2EL (ms)"]
    assert [x for x in labels if x in order] == order


def _by_category():
    return {"qa": {"num_requests": 3, "num_failed": 0, "acceptance_rate": 0.5, "acceptance_length": 2.25},
            "rag": {"num_requests": 2, "num_failed": 2, "acceptance_rate": None, "acceptance_length": None}}


def test_format_report_acceptance_by_category():
    """More than one category: the by-category table follows the main report (from
    metrics["analytics"]["by_category"]); one category: no table."""
    m = dict(compute_metrics(_trace(), 2.0, K), analytics={"by_category": _by_category()})
    text = format_report(m, "bench")
    main, _, table = text.partition("Acceptance by category")
    assert "P99 TTFT (ms)" in main and table
    rows = [line.split() for line in table.splitlines() if line.strip()]
    assert rows[0] == ["Category", "Requests", "Acceptance", "rate", "(%)", "Acceptance", "length"]
    assert rows[2:] == [["qa", "3", "50.00", "2.25"], ["rag", "2", "(2", "failed)", "—", "—"]]
    one = dict(m, analytics={"by_category": {"qa": _by_category()["qa"]}})
    assert "Acceptance by category" not in format_report(one, "bench")
    assert "Acceptance by category" not in format_report(compute_metrics(_trace(), 2.0, K), "eval")


def _cost_model():
    return {"1": {"decode_steps": 2, "steps": 1, "predicted_tokens_per_request": 1.75,
                  "measured_tokens_per_request": 3.0, "predicted_step_ms": 10.85, "measured_step_ms": 10.5,
                  "predicted_speedup": 1.25, "measured_speedup": 2.8571, "plain_step_ms_source": "calibrated",
                  "plain_steps": 0},
            "4-7": {"decode_steps": 3, "steps": 3, "predicted_tokens_per_request": 1.5192,
                    "measured_tokens_per_request": 1.5385, "predicted_step_ms": 23.0833,
                    "measured_step_ms": 21.0833, "predicted_speedup": 1.1792, "measured_speedup": 1.2648,
                    "plain_step_ms_source": "measured", "plain_steps": 1},
            "16-31": {"decode_steps": 1, "steps": 0, "predicted_speedup": None, "measured_speedup": None}}


def test_format_report_automatic_k_depths_and_cost_model_table():
    """num_speculative_tokens=auto: a row of draft depths per request, and the cost model's
    predicted vs measured speed-up per batch bucket after the main table (buckets without compared
    steps left out); a fixed k: neither."""
    m = dict(compute_metrics(_trace(), 2.0, K), k_histogram={"0": 1, "3": 3},
             auto_k={"depth_histogram": {"3": 3, "1": 1}, "cost_model": _cost_model()})
    text = format_report(m, "eval")
    main, _, table = text.partition("Cost model: predicted vs measured speed-up over k = 0, per batch size")
    assert any(line.split() == ["Draft", "depth", "per", "request", "(%", "of", "requests)", "1:", "25.0",
                                "·", "3:", "75.0"] for line in main.splitlines())
    rows = [line.split() for line in table.splitlines() if line.strip()]
    assert rows[-2:] == [["1", "2", "1", "1.250x", "2.857x", "10.85", "10.50", "calibrated"],
                         ["4-7", "3", "3", "1.179x", "1.265x", "23.08", "21.08", "measured", "(1)"]]
    fixed = format_report(compute_metrics(_trace(), 2.0, K), "eval")
    assert "Cost model" not in fixed and "Draft depth per request" not in fixed
