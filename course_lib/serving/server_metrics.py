"""The server's Prometheus metrics (``GET /metrics``, text exposition format), with ``prometheus_client``.

Each ServerMetrics has its own CollectorRegistry (two servers in one process do not share counters).

    course_queue_length                 gauge      requests waiting for admission
    course_running_requests             gauge      requests in the running batch
    course_kv_blocks_used / _total      gauge      paged KV blocks in use / in the pool
    course_token_throughput             gauge      generated tokens/s over the last `window_s` seconds
    course_prompt_tokens_total          counter    prompt tokens admitted
    course_generation_tokens_total      counter    tokens generated (rate() of it is the throughput too)
    course_requests_finished_total      counter    by finish_reason (length | stop)
    course_requests_rejected_total      counter    by HTTP status (400, 404, 413, ...)
    course_requests_aborted_total       counter    requests stopped because their client disconnected
                                                   (not in finished_total nor in the latency histograms)
    course_time_to_first_token_seconds  histogram  TTFT per request (arrival -> first token)
    course_time_per_output_token_seconds histogram TPOT per request (requests with >= 2 tokens)
    course_e2e_request_latency_seconds  histogram  arrival -> finish

The latencies come from each request's ``course_lib.perf.metrics.Trace`` (the engine's record), observed
when it finishes.
"""
from __future__ import annotations

import collections
import threading
import time

__all__ = ["ServerMetrics", "parse_metrics"]

_LAT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    def __init__(self, num_blocks: int, window_s: float = 10.0):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.window_s = window_s
        self.queue = Gauge("course_queue_length", "Requests waiting for admission", registry=r)
        self.running = Gauge("course_running_requests", "Requests in the running batch", registry=r)
        self.blocks_used = Gauge("course_kv_blocks_used", "Paged KV blocks in use", registry=r)
        self.blocks_total = Gauge("course_kv_blocks_total", "Paged KV blocks in the pool", registry=r)
        self.blocks_total.set(num_blocks)
        self.throughput = Gauge("course_token_throughput", f"Generated tokens/s over the last {window_s:g} s",
                                registry=r)
        self.prompt_tokens = Counter("course_prompt_tokens", "Prompt tokens admitted", registry=r)
        self.gen_tokens = Counter("course_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter("course_requests_finished", "Requests finished", ["finish_reason"], registry=r)
        self.rejected = Counter("course_requests_rejected", "Requests refused", ["status"], registry=r)
        self.aborted = Counter("course_requests_aborted", "Requests aborted before they finished (the client "
                               "disconnected)", registry=r)
        self.ttft = Histogram("course_time_to_first_token_seconds", "Time to first token", buckets=_LAT_BUCKETS,
                              registry=r)
        self.tpot = Histogram("course_time_per_output_token_seconds", "Time per output token (after the first)",
                              buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("course_e2e_request_latency_seconds", "Arrival to finish", buckets=_LAT_BUCKETS,
                             registry=r)
        self._recent = collections.deque()        # (time, tokens) of the last window_s seconds
        self._lock = threading.Lock()

    def on_admit(self, prompt_tokens: int):
        self.prompt_tokens.inc(prompt_tokens)

    def on_tokens(self, n: int, now: float | None = None):
        if n:
            self.gen_tokens.inc(n)
            with self._lock:
                self._recent.append((time.perf_counter() if now is None else now, n))

    def on_finish(self, trace):
        self.finished.labels(trace.finish_reason or "unknown").inc()
        if trace.n_tokens:
            self.ttft.observe(trace.ttft)
            self.e2e.observe(trace.e2e)
            if trace.tpot is not None:
                self.tpot.observe(trace.tpot)

    def on_rejected(self, status: int):
        self.rejected.labels(str(status)).inc()

    def on_abort(self, trace=None):
        """A request whose client left: in the engine (its `trace` ended "abort"), or before it got there
        (no trace)."""
        self.aborted.inc()

    def observe_engine(self, engine):
        self.queue.set(len(engine.waiting))
        self.running.set(len(engine.running))
        self.blocks_used.set(engine.manager.num_used_blocks)

    def tokens_per_second(self, now: float | None = None) -> float:
        now = time.perf_counter() if now is None else now
        with self._lock:
            while self._recent and self._recent[0][0] < now - self.window_s:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / self.window_s

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        self.throughput.set(self.tokens_per_second())
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def parse_metrics(text: str) -> dict:
    """{sample name (with labels, as written): value} of a Prometheus text page (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out
