"""The engine's load and KV usage under the names vLLM publishes, for routers and autoscalers built for vLLM.

Role: :class:`VllmNamesCollector` reads ``LLMEngine.stats()`` at scrape time (as
``oscarkv.server.metrics.EngineCollector`` does) and yields the gauges that vllm-router (``kv_aware``,
which reads running and waiting requests and KV usage), the Kubernetes autoscaling recipes and
production-stack scrape from vLLM: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` and its former name ``vllm:gpu_cache_usage_perc`` (a fraction in [0, 1],
as vLLM's; here the larger of the BF16 and INT2 pools' occupancy: a request needs pages of both), and
the prefix-cache counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (tokens). Each carries
vLLM's ``model_name`` label.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from oscarkv.engine.engine import LLMEngine


class VllmNamesCollector:
    """vLLM-named gauges and counters of one engine, computed on each scrape."""

    def __init__(self, engine: LLMEngine, model_name: str) -> None:
        self.engine, self.labels = engine, [model_name]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric(self.labels, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric(self.labels, value)
        return c

    def collect(self):
        s = self.engine.stats()
        usage = max((t.pages_used / max(t.pages_total, 1) for t in s.tiers.values()), default=0.0)
        yield self._gauge("vllm:num_requests_running", "Requests in the running batch (vLLM's name)", s.running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled (vLLM's name)", s.waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means full (vLLM's name)", usage)
        yield self._gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 means full (vLLM's former name)", usage)
        yield self._counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache (vLLM's name)",
                            s.prompt_tokens)
        yield self._counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache (vLLM's name)",
                            s.prefix_hit_tokens)
