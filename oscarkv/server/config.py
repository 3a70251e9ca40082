"""``ServerConfig``: what the HTTP layer adds on top of :class:`~oscarkv.config.EngineConfig`.

CLI flags of ``oscarkv serve`` derive from these fields (``oscarkv.cli.add_fields``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    """Network address, the served model's name and request limits of ``oscarkv serve``."""

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

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"ServerConfig.port must lie in [0, 65535], got {self.port}")
        if self.max_model_len < 0:
            raise ValueError(f"ServerConfig.max_model_len must be >= 0, got {self.max_model_len}")
        if self.default_max_tokens < 0:
            raise ValueError(f"ServerConfig.default_max_tokens must be >= 0, got {self.default_max_tokens}")
