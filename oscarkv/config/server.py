"""Serving configuration of the HTTP layer: ``oscarkv serve``'s address, limits and access control
(``ServerConfig``) and its replicas behind a router (``ReplicaConfig``). Public through :mod:`oscarkv.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServerConfig:
    """Network address, the served model's name, request limits, shutdown and access control of
    ``oscarkv serve``."""

    host: str = "127.0.0.1"
    """Interface to bind (loopback by default; ``0.0.0.0`` serves every interface)."""
    port: int = 8000
    """TCP port; ``0`` lets the OS pick a free one (the chosen port is logged)."""
    served_model_name: str = ""
    """The ``model`` id clients must send and ``/v1/models`` lists; empty: the ``--model`` spec."""
    max_model_len: int = 0
    """Longest sequence (prompt + generated tokens) a request may ask for; ``0``: the smaller of
    the model's ``max_position_embeddings`` and what the KV pools hold for one sequence."""
    default_max_tokens: int = 0
    """``max_tokens`` of requests that leave it out; ``0``: the rest of the context (vLLM's
    choice for chat), and 16 for ``/v1/completions`` (OpenAI's documented default)."""
    max_request_bytes: int = 16 << 20
    """Largest request body accepted; a larger one is answered 413 before it is parsed. 16 MiB
    holds a 1M-token prompt sent as token ids."""
    shutdown_grace: float = 30.0
    """Seconds a SIGTERM or SIGINT lets requests in flight finish (new ones are refused); those
    still running then end with an error event (a 503 before their response started)."""
    api_key: str = field(default="", repr=False)
    """Bearer token every ``/v1/*`` request must carry (``Authorization: Bearer KEY``); empty: no
    check. ``oscarkv serve`` also reads it from ``OSCARKV_API_KEY``, which keeps it out of
    process listings."""
    protect_metrics: bool = False
    """Ask for the API key on ``/metrics`` too (``/health`` is always open)."""
    kv_events_endpoint: str = ""
    """ZMQ endpoint to publish prefix-cache events on, in vLLM's KV-event format (``tcp://*:5557``), for
    routers that follow each replica's cache (``oscarkv.server.kv_events``); empty: none."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"ServerConfig.port must lie in [0, 65535], got {self.port}")
        if self.max_model_len < 0:
            raise ValueError(f"ServerConfig.max_model_len must be >= 0, got {self.max_model_len}")
        if self.default_max_tokens < 0:
            raise ValueError(f"ServerConfig.default_max_tokens must be >= 0, got {self.default_max_tokens}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"ServerConfig.max_request_bytes must be >= 1024, got {self.max_request_bytes}")
        if not self.shutdown_grace >= 0:
            raise ValueError(f"ServerConfig.shutdown_grace must be >= 0 seconds, got {self.shutdown_grace}")
        if self.protect_metrics and not self.api_key:
            raise ValueError("ServerConfig.protect_metrics needs ServerConfig.api_key (oscarkv serve also reads it "
                             "from OSCARKV_API_KEY)")


ROUTER_POLICIES = ("cache_aware", "kv_aware", "round_robin", "power_of_two", "random")
"""Policies of vllm-router that ``oscarkv serve --data-parallel-size N`` can start it with: ``cache_aware``
(a radix tree of the prompts each replica served), ``kv_aware`` (the replicas' prefix-cache events),
``round_robin``, ``power_of_two`` (the less loaded of two), ``random``."""


@dataclass(frozen=True)
class ReplicaConfig:
    """Data parallelism as users deploy it: ``oscarkv serve`` replicas behind vllm-router
    (``oscarkv.server.replicas``)."""

    data_parallel_size: int = 1
    """Replicas of the engine to start (each with its own tensor-parallel ranks); above 1, the router listens
    on ``--host``/``--port`` and the replicas on free loopback ports (printed)."""
    router_policy: str = "cache_aware"
    """How the router picks a replica (:data:`ROUTER_POLICIES`)."""
    replica_startup_timeout: float = 600.0
    """Seconds to wait for every replica (and then the router) to answer ``/health``."""

    def __post_init__(self) -> None:
        if self.data_parallel_size < 1:
            raise ValueError(f"ReplicaConfig.data_parallel_size must be >= 1, got {self.data_parallel_size}")
        if self.router_policy not in ROUTER_POLICIES:
            raise ValueError(f"ReplicaConfig.router_policy must be one of {ROUTER_POLICIES}, got {self.router_policy!r}")
        if not self.replica_startup_timeout > 0:
            raise ValueError(f"ReplicaConfig.replica_startup_timeout must be > 0 seconds, got {self.replica_startup_timeout}")
