"""A snapshot of what an :class:`~oscarkv.engine.engine.LLMEngine` holds and has done.

Role: ``LLMEngine.stats()`` reads the pools, the prefix cache, the scheduler and the engine's
token counters into a frozen :class:`EngineStats` and returns it to offline
users, and the server's Prometheus collector (``oscarkv.server.metrics``) renders it on each
scrape.

NOTE: a server reads the snapshot from the event-loop thread while the engine thread steps; it
only takes ``len()`` of containers and reads integers, which are atomic under the GIL, so a
snapshot may be one step stale but never inconsistent enough to raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oscarkv.engine.speculative import SpecStats


@dataclass(frozen=True)
class TierStats:
    """One page pool."""

    pages_used: int
    """Pages held by requests (cached pages no request holds count as free)."""
    pages_total: int
    """Pages of the pool, the scratch page excluded."""
    capacity_tokens: int
    page_bytes: int
    elements_per_token: int | None = None
    """KV elements a token holds in this pool; ``None``: :attr:`EngineStats.elements_per_token` (the window
    pool of sliding layers has its own)."""

    @property
    def pages_free(self) -> int:
        return self.pages_total - self.pages_used


@dataclass(frozen=True)
class EngineStats:
    """Pools, prefix cache, queue and token counters at one moment."""

    tiers: dict[str, TierStats]
    """``bf16`` and, for quantized methods, ``int2``."""
    elements_per_token: int
    """K and V elements of one token, all layers."""
    bpe_at_capacity: float
    prefix_hit_tokens: int
    """Prompt tokens served from the prefix cache (a preempted request's re-admission counts again)."""
    prompt_tokens: int
    """Prompt tokens of the requests added so far."""
    generated_tokens: int
    """Tokens sampled so far."""
    preemptions: int
    waiting: int
    running: int
    steps_ahead: int = 0
    """Decode steps launched before the previous step's tokens reached the host (overlap)."""
    speculative: SpecStats | None = None
    """Speculative decoding's counters (a copy), or None when it is off."""
    prompt_tokens_reused: int = 0
    """Prompt tokens taken from an earlier text's ids instead of tokenized (``TokenMemo.reused``)."""

    @property
    def prefix_hit_rate(self) -> float:
        """Prefix-cache hit tokens / prompt tokens (0 before any request)."""
        return self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def bpe_in_use(self) -> float:
        """Bits per stored element over the pages now in use (0 when nothing is stored)."""
        used = [t for t in self.tiers.values() if t.pages_used]
        elements = sum(t.pages_used * t.capacity_tokens // max(t.pages_total, 1) * (t.elements_per_token or self.elements_per_token)
                       for t in used)
        bits = sum(8 * t.pages_used * t.page_bytes for t in used)
        return bits / elements if elements else 0.0
