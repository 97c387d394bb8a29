"""guidellm's TTFT and ITL against the server's /metrics means over the same requests.

Usage: python compare_metrics.py BEFORE.txt AFTER.txt GUIDELLM.json
BEFORE/AFTER: /metrics scraped before and after the guidellm run (nothing else ran in between).
The server's means are (sum after - sum before) / (count after - count before) of
mtpx:time_to_first_token_seconds and mtpx:time_per_output_token_seconds. guidellm's ITL is
(request latency - TTFT) / (output tokens - 1) per token (its docs), which is the server's TPOT;
the server's mtpx:inter_token_latency_seconds is the gap between emissions (several accepted
tokens arrive in one emission), printed for reference.
"""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def sums(path: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(open(path).read()):
        for s in fam.samples:
            if s.name.endswith(("_sum", "_count")) or s.name in ("mtpx:request_success_total",):
                key = s.name + (f"{{{s.labels['finished_reason']}}}" if "finished_reason" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def mean(before: dict, after: dict, name: str) -> tuple[float, int]:
    n = after[f"{name}_count"] - before.get(f"{name}_count", 0)
    return (after[f"{name}_sum"] - before.get(f"{name}_sum", 0)) / max(n, 1), int(n)


def main(before_path: str, after_path: str, guidellm_path: str) -> None:
    before, after = sums(before_path), sums(after_path)
    report = json.load(open(guidellm_path))
    g_ttft = g_itl = 0.0
    g_n = errors = 0
    for b in report["benchmarks"]:
        m = b["metrics"]
        n = m["request_totals"]["successful"]
        errors += m["request_totals"]["errored"] + m["request_totals"]["incomplete"]
        g_ttft += m["time_to_first_token_ms"]["successful"]["mean"] * n
        g_itl += m["inter_token_latency_ms"]["successful"]["mean"] * n
        g_n += n
    s_ttft, n_ttft = mean(before, after, "mtpx:time_to_first_token_seconds")
    s_tpot, n_tpot = mean(before, after, "mtpx:time_per_output_token_seconds")
    s_itl, _ = mean(before, after, "mtpx:inter_token_latency_seconds")
    print(f"guidellm: {len(report['benchmarks'])} benchmark(s), {g_n} successful requests, {errors} errored "
          "or incomplete")
    print(f"server:   {n_ttft} requests finished (TTFT observations), {n_tpot} TPOT observations")
    print("| metric | guidellm mean (ms) | server /metrics mean (ms) | difference |")
    print("|---|---:|---:|---:|")
    for name, g, s in (("TTFT", g_ttft / g_n, s_ttft * 1e3),
                       ("ITL (guidellm) vs TPOT (server)", g_itl / g_n, s_tpot * 1e3)):
        print(f"| {name} | {g:.1f} | {s:.1f} | {100 * (g - s) / s:+.1f}% |")
    print(f"(server emission gaps, mtpx:inter_token_latency_seconds: {s_itl * 1e3:.1f} ms)")


if __name__ == "__main__":
    main(*sys.argv[1:])
