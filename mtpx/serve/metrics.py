"""Prometheus metrics of `mode=serve` (the official prometheus_client, one registry per server).

Names follow vLLM's with an `mtpx:` prefix: the spec-decode counters
(`mtpx:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos{position}`; prometheus_client exposes counters with a `_total`
suffix, as vLLM's are), request and token counters, TTFT / TPOT / ITL / E2EL histograms (the
definitions of mtpx.metrics.stats), running / waiting requests, KV blocks in use, prefix-cache
hits and queries (prompt tokens), and the speculative tokens per step. TTFT and E2EL count from
the HTTP request's arrival (reading its body, parsing and tokenization included), as a client sees
them.

Latency buckets: by default a geometric grid, 2**(1/4) apart (19% per bucket) from 0.5 ms to
about 17 minutes (DEFAULT_LATENCY_BUCKETS), so a quantile interpolated from them is within one
bucket's 19% at any model speed; `serve.latency_buckets` (a list of upper bounds in seconds)
replaces them.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mtpx.core.request import Request

# 0.5 ms .. 1049 s
DEFAULT_LATENCY_BUCKETS = tuple(round(0.0005 * 2 ** (i / 4), 6) for i in range(4 * 21 + 1))


def check_buckets(buckets, key: str = "serve.latency_buckets") -> tuple[float, ...]:
    """A list of histogram upper bounds (seconds, increasing, > 0) as a tuple; ValueError naming
    `key` otherwise."""
    values = list(buckets)
    if not values or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0
                             for b in values) \
            or any(b >= c for b, c in zip(values, values[1:])):
        raise ValueError(f"{key}={values!r}: must be a non-empty increasing list of seconds > 0 "
                         "(e.g. [0.01, 0.02, 0.05, 0.1]), or null for the default grid")
    return tuple(float(b) for b in values)


class ServerMetrics:
    """num_speculative_tokens: the k the engine drafts per step; stats(): AsyncEngine.stats (read
    when /metrics is scraped); latency_buckets: the histograms' upper bounds in seconds (None:
    DEFAULT_LATENCY_BUCKETS)."""

    def __init__(self, num_speculative_tokens: int, stats, latency_buckets=None):
        buckets = DEFAULT_LATENCY_BUCKETS if latency_buckets is None else check_buckets(latency_buckets)
        r = self.registry = CollectorRegistry()
        p = "mtpx:"
        self.num_drafts = Counter(f"{p}spec_decode_num_drafts", "Verification rounds with >= 1 draft.",
                                  registry=r)
        self.num_draft_tokens = Counter(f"{p}spec_decode_num_draft_tokens", "Draft tokens proposed.",
                                        registry=r)
        self.num_accepted = Counter(f"{p}spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                    registry=r)
        self.per_pos = Counter(f"{p}spec_decode_num_accepted_tokens_per_pos", "Accepted drafts per position.",
                               ["position"], registry=r)
        self.requests = Counter(f"{p}request_success", "Finished requests.", ["finished_reason"], registry=r)
        self.prompt_tokens = Counter(f"{p}prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter(f"{p}generation_tokens", "Output tokens of finished requests.",
                                         registry=r)
        self.prefix_hits = Counter(f"{p}prefix_cache_hits", "Prompt tokens served by the prefix cache.",
                                   registry=r)
        self.prefix_queries = Counter(f"{p}prefix_cache_queries", "Prompt tokens looked up.", registry=r)
        self.ttft = Histogram(f"{p}time_to_first_token_seconds", "Time to first token.", buckets=buckets,
                              registry=r)
        self.tpot = Histogram(f"{p}time_per_output_token_seconds", "(E2EL - TTFT) / (output tokens - 1).",
                              buckets=buckets, registry=r)
        self.itl = Histogram(f"{p}inter_token_latency_seconds", "Gaps between a request's emissions.",
                             buckets=buckets, registry=r)
        self.e2el = Histogram(f"{p}e2e_request_latency_seconds", "Arrival to last token.", buckets=buckets,
                              registry=r)
        for name, key, doc in (("num_requests_running", "num_running", "Requests in the batch."),
                               ("num_requests_waiting", "num_waiting",
                                "Requests waiting for a slot or blocks."),
                               ("kv_cache_blocks_in_use", None, "KV blocks referenced by requests."),
                               ("batch_slots_in_use", "num_batch_slots_in_use", "Batch slots held.")):
            g = Gauge(f"{p}{name}", doc, registry=r)
            if key is None:
                g.set_function(lambda: stats()["num_kv_blocks"] - stats()["num_free_kv_blocks"])
            else:
                g.set_function(lambda key=key: stats()[key])
        Gauge(f"{p}num_speculative_tokens", "Draft tokens per step (k).",
              registry=r).set(num_speculative_tokens)
        for i in range(num_speculative_tokens):       # every position is exported from the start
            self.per_pos.labels(position=str(i))

    def record(self, req: Request, first_of_prompt: bool = True, output_counted: bool = True) -> None:
        """Count one finished request (called in the engine thread). Its prompt counts in
        prompt_tokens only when first_of_prompt: once per HTTP request with n > 1, as vLLM and
        the responses' usage count it; its output tokens only when output_counted (echo with
        max_tokens=0 drops its one token from the response and its usage)."""
        s = req.spec
        self.num_drafts.inc(s.num_drafts)
        self.num_draft_tokens.inc(s.num_draft_tokens)
        self.num_accepted.inc(s.num_accepted_tokens)
        for i, n in enumerate(s.accepted_per_position):
            self.per_pos.labels(position=str(i)).inc(n)
        self.requests.labels(finished_reason=req.finish_reason or "error").inc()
        if first_of_prompt:
            self.prompt_tokens.inc(len(req.prompt_token_ids))
        if output_counted:
            self.generation_tokens.inc(len(req.output_token_ids))
        self.prefix_hits.inc(req.num_cached_tokens)
        self.prefix_queries.inc(len(req.prompt_token_ids))
        if req.first_token_time is not None:
            self.ttft.observe(req.first_token_time - req.arrival_time)
            end = req.finish_time or req.first_token_time
            self.e2el.observe(end - req.arrival_time)
            if len(req.output_token_ids) > 1:
                self.tpot.observe((end - req.first_token_time) / (len(req.output_token_ids) - 1))
            for a, b in zip(req.emission_times, req.emission_times[1:]):
                self.itl.observe(b - a)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
