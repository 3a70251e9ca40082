"""Prefix-cache events: which page keys a replica holds, for routers that follow the cache.

Role: :class:`CacheObserver` is what the manager tells (``KVCacheManager.watch``): a full page's content
key became held (with its parent key and tokens), a key stopped being held, everything was dropped.
:class:`BlockTracker` turns the pools' view into that logical one: a key is *held* while at least one
pool (BF16 or INT2) keeps a page with it, so an observer sees one ``stored`` when a block first enters
the replica and one ``removed`` when its last copy is evicted (a page demoted from BF16 to INT2 moves
tiers without events). Where the events go next: ``oscarkv.server.kv_events`` publishes them in vLLM's
KV-event format. NOTE: observers run on the engine's thread, inside ``commit`` and allocation: they
must only queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class CacheObserver(Protocol):
    """Told what the prefix cache holds (see the module docstring)."""

    def stored(self, key: bytes, parent: bytes | None, tokens: Sequence[int]) -> None:
        """Page content ``key`` (following ``parent``, ``None`` for a sequence's first page) is now held."""

    def removed(self, key: bytes) -> None:
        """No page with content ``key`` is held any more."""

    def cleared(self) -> None:
        """Nothing is held (a reset)."""


class BlockTracker:
    """Counts the pools holding each key and tells the observers when a key arrives or leaves."""

    def __init__(self) -> None:
        self.observers: list[CacheObserver] = []
        self._holders: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._holders)

    def __contains__(self, key: bytes) -> bool:
        return key in self._holders

    def added(self, key: bytes, parent: bytes | None, tokens: Sequence[int]) -> None:
        """One more pool holds ``key``."""
        n = self._holders.get(key, 0)
        self._holders[key] = n + 1
        if not n:
            for o in self.observers:
                o.stored(key, parent, tokens)

    def evicted(self, key: bytes) -> None:
        """One pool dropped ``key``."""
        n = self._holders.pop(key, 0) - 1  # NOTE: -1: a key held before anyone watched
        if n > 0:
            self._holders[key] = n
        elif n == 0:
            for o in self.observers:
                o.removed(key)
