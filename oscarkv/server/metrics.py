"""Prometheus metrics of one server app, on its own ``CollectorRegistry`` (no global state).

Role: :class:`ServerMetrics` owns the registry. Request-side series (HTTP responses by status,
prompt and generated tokens, finish reasons, TTFT, TPOT and end-to-end latency histograms) are
updated as requests run (HTTP responses by the middleware of ``oscarkv.server.app``, the rest by
``Server.generate`` in ``oscarkv.server.state``). Engine-side series are read at scrape time
by :class:`EngineCollector` from ``AsyncEngine.stats()`` (:mod:`oscarkv.engine.stats`, safe to
read from the event-loop thread): pages used and total per tier, capacity in tokens per tier,
BPE at capacity and over the pages in use, prefix-cache hit tokens and hit rate, preemptions,
decode steps launched ahead (overlap), queue depth and running sequences. ``GET /metrics`` renders the registry in the text
exposition format.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.engine.speculative import SpecStats

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class EngineCollector:
    """Engine gauges and counters, computed on each scrape."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def collect(self):
        s = self.engine.stats()
        used = GaugeMetricFamily("oscarkv_kv_pages_used", "KV pool pages held by requests", labels=["tier"])
        total = GaugeMetricFamily("oscarkv_kv_pages_total", "KV pool pages", labels=["tier"])
        occ = GaugeMetricFamily("oscarkv_kv_pool_occupancy", "Fraction of KV pool pages in use", labels=["tier"])
        cap = GaugeMetricFamily("oscarkv_kv_capacity_tokens", "Tokens each KV tier can hold", labels=["tier"])
        for name, t in s.tiers.items():
            used.add_metric([name], t.pages_used)
            total.add_metric([name], t.pages_total)
            occ.add_metric([name], t.pages_used / max(t.pages_total, 1))
            cap.add_metric([name], t.capacity_tokens)
        yield from (used, total, occ, cap)
        yield GaugeMetricFamily("oscarkv_kv_bpe_at_capacity", "Bits per KV element with the pools full", value=s.bpe_at_capacity)
        yield GaugeMetricFamily("oscarkv_kv_bpe_in_use", "Bits per KV element over the pages in use (effective BPE)",
                                value=s.bpe_in_use)
        yield CounterMetricFamily("oscarkv_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
                                  value=s.prefix_hit_tokens)
        yield GaugeMetricFamily("oscarkv_prefix_cache_hit_rate", "Prefix-cache hit tokens / prompt tokens",
                                value=s.prefix_hit_rate)
        yield CounterMetricFamily("oscarkv_prompt_tokens_reused", "Prompt tokens taken from an earlier text's ids "
                                  "instead of tokenized (a chat's earlier turns)", value=s.prompt_tokens_reused)
        yield CounterMetricFamily("oscarkv_preemptions", "Sequences preempted (by recompute) for KV pages",
                                  value=s.preemptions)
        yield CounterMetricFamily("oscarkv_decode_steps_ahead", "Decode steps launched before the previous "
                                  "step's tokens reached the host (engine overlap)", value=s.steps_ahead)
        yield GaugeMetricFamily("oscarkv_queue_depth", "Requests waiting to be scheduled", value=s.waiting)
        yield GaugeMetricFamily("oscarkv_running_requests", "Requests in the running batch", value=s.running)
        yield from speculative_metrics(s.speculative)


def speculative_metrics(st: SpecStats | None):
    """Speculative decoding (``EngineConfig.speculative``; nothing when it is off): drafted and accepted
    tokens, the acceptance rate and the tokens a sequence gains per decode step."""
    if st is None:
        return
    yield CounterMetricFamily("oscarkv_spec_draft_tokens", "Drafted tokens verified", value=st.drafted)
    yield CounterMetricFamily("oscarkv_spec_accepted_tokens", "Drafted tokens accepted", value=st.accepted)
    yield CounterMetricFamily("oscarkv_spec_verify_steps", "Decode steps that verified drafts", value=st.verify_steps)
    yield CounterMetricFamily("oscarkv_spec_verify_graph_steps", "Verify steps replayed as one chunk by an extend "
                              "CUDA graph (the others ran as decode rows)", value=st.graph_steps)
    yield GaugeMetricFamily("oscarkv_spec_acceptance_rate", "Accepted / drafted tokens", value=st.acceptance_rate)
    yield GaugeMetricFamily("oscarkv_spec_tokens_per_step", "Tokens a sequence gains per decode step",
                            value=st.tokens_per_step)


class ServerMetrics:
    """The registry of one app and the request-side series (see the module docstring)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.registry = r = CollectorRegistry()
        self.http = Counter("oscarkv_http_responses", "HTTP responses", ["path", "status"], registry=r)
        self.requests = Counter("oscarkv_requests", "Generation requests finished", ["endpoint", "finish_reason"], registry=r)
        self.prompt_tokens = Counter("oscarkv_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("oscarkv_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("oscarkv_time_to_first_token_seconds", "Arrival to first token", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("oscarkv_time_per_output_token_seconds", "Mean time per output token after the first",
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("oscarkv_e2e_request_latency_seconds", "Arrival to last token", buckets=E2E_BUCKETS, registry=r)
        r.register(EngineCollector(engine))

    def admit(self, prompt_tokens: int) -> None:
        """Record an admitted request's prompt."""
        self.prompt_tokens.inc(prompt_tokens)

    def observe_request(self, endpoint: str, reason: str, n_tokens: int, ttft: float | None, e2e: float) -> None:
        """Record one finished (or aborted) request."""
        self.requests.labels(endpoint, reason).inc()
        self.generation_tokens.inc(n_tokens)
        if ttft is not None:
            self.ttft.observe(ttft)
            self.e2e.observe(e2e)
            if n_tokens > 1:
                self.tpot.observe((e2e - ttft) / (n_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
