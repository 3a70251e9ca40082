"""What one ``oscarkv serve`` adds for a router in front of several replicas: vLLM-named metrics, cache events.

Role: :func:`attach` (called by ``oscarkv.server.launch.build_server``) registers
:class:`~oscarkv.server.vllm_metrics.VllmNamesCollector` on the app's metrics and, when
``ServerConfig.kv_events_endpoint`` is set, starts a
:class:`~oscarkv.server.kv_events.KVEventPublisher` watching the engine's prefix cache. The replicas and
the router themselves are started by ``oscarkv.server.replicas`` (``oscarkv serve --data-parallel-size N``).
"""

from __future__ import annotations

import logging

from oscarkv.config import ServerConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.server.vllm_metrics import VllmNamesCollector

log = logging.getLogger("oscarkv.serve")


def attach(app, engine: LLMEngine, cfg: ServerConfig) -> None:
    """vLLM-named gauges on ``app``'s ``/metrics``; the KV-event publisher when an endpoint is configured.
    NOTE: the publisher's thread is a daemon and its socket does not linger: it ends with the process."""
    app.state.server.metrics.registry.register(VllmNamesCollector(engine, cfg.served_model_name))
    if cfg.kv_events_endpoint:
        from oscarkv.server.kv_events import KVEventPublisher  # pyzmq and msgpack: the 'router' extra

        engine.manager.watch(KVEventPublisher(cfg.kv_events_endpoint, engine.cfg.kv.page_size))
        log.info("oscarkv serve: publishing prefix-cache events (vLLM's KV-event format) on %s", cfg.kv_events_endpoint)
