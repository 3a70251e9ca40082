"""Page bookkeeping of one pool: free list, reference counts, content keys, LRU eviction.

Role: the block pool behind :class:`~oscarkv.cache.manager.KVCacheManager` (vLLM v1's
``BlockPool``). It owns no tensors — only page ids ``1 .. N-1`` (page 0 is the scratch page
of the layout contract, never handed out) and, per page, a reference count and an optional
content key. The engine has two of them: one for BF16 pages, one for INT2 pages.

States of a page (NOTE: the invariants the property tests check):

* **free**: ref 0, no key, in ``_free``;
* **used**: ref > 0 (shared by ``ref`` sequences), with or without a key;
* **cached**: ref 0 with a key, in ``_evictable`` (least recently released first). Its bytes
  are intact, so :meth:`lookup` can revive it; :meth:`allocate` evicts the oldest one (and
  forgets its key) only when no free page is left.

A key names a page's content (``oscarkv.cache.seq_kv.page_keys``); at most one page per key.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class PoolExhausted(RuntimeError):
    """No free or evictable page is left."""


class PagePool:
    """Reference-counted page ids with a content-keyed LRU cache (see the module docstring)."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages  # including the scratch page 0
        self._ref = [0] * num_pages
        self._free: deque[int] = deque(range(1, num_pages))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._key_of: dict[int, bytes] = {}
        self._page_of: dict[bytes, int] = {}
        self.on_evict: list = []  # callables told each key an allocation evicts (oscarkv.cache.events)

    @property
    def num_available(self) -> int:
        """Pages an allocation could get now (free plus evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_free(self) -> int:
        """Pages that hold nothing (allocating them evicts no cached page)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - 1 - self.num_available

    def ref(self, page: int) -> int:
        return self._ref[page]

    def allocate(self) -> int:
        """A page with ref 1 and no key: a free one, else the least recently released cached one."""
        if self._free:
            page = self._free.popleft()
        elif self._evictable:
            page, _ = self._evictable.popitem(last=False)
            key = self._key_of.pop(page)
            del self._page_of[key]
            for tell in self.on_evict:
                tell(key)
        else:
            raise PoolExhausted(f"all {self.num_pages - 1} pages are in use")
        self._ref[page] = 1
        return page

    def peek(self, key: bytes) -> bool:
        """Whether a page with this content is held (used or cached)."""
        return key in self._page_of

    def lookup(self, key: bytes) -> int | None:
        """Take a reference on the page holding ``key`` (reviving it if cached), or ``None``."""
        page = self._page_of.get(key)
        if page is None:
            return None
        if self._ref[page] == 0:
            del self._evictable[page]
        self._ref[page] += 1
        return page

    def holds(self, keys: list[bytes]):
        """:meth:`peek` of each key, lazily (C speed: a 100K-token prefix is ~1 600 keys)."""
        return map(self._page_of.__contains__, keys)

    def lookup_all(self, keys: list[bytes]) -> list[int]:
        """:meth:`lookup` of every key, each held (``KeyError`` if not); one loop with no method call per key."""
        ref, cached, pages = self._ref, self._evictable, list(map(self._page_of.__getitem__, keys))
        for page in pages:
            if not ref[page]:
                del cached[page]
            ref[page] += 1
        return pages

    def touch(self, key: bytes) -> None:
        """Make the cached page holding ``key`` the most recently released (evicted last); else nothing."""
        page = self._page_of.get(key)
        if page is not None and page in self._evictable:
            self._evictable.move_to_end(page)

    def register(self, page: int, key: bytes) -> bool:
        """Record that used ``page`` holds content ``key`` (ignored if the key or page is known); whether it did."""
        assert self._ref[page] > 0, f"register on unused page {page}"
        if key in self._page_of or page in self._key_of:
            return False
        self._page_of[key] = page
        self._key_of[page] = key
        return True

    def release(self, page: int) -> None:
        """Drop one reference; at zero a keyed page becomes cached, an unkeyed one free."""
        assert page > 0 and self._ref[page] > 0, f"double free of page {page}"
        self._ref[page] -= 1
        if self._ref[page] == 0:
            if page in self._key_of:
                self._evictable[page] = None
            else:
                self._free.append(page)

    def release_all(self, pages: list[int], stale: bool = False) -> None:
        """:meth:`release` of every page in ``pages``, in order; with ``stale``, keyed pages that become cached
        go first in the eviction order instead of last (a BF16 page whose tokens were demoted: its content is
        in INT2 too, and only a hit ending exactly there reads it). NOTE: one loop with no method call per
        page: a 100K-token sequence holds ~1 600 INT2 pages, freed when it finishes."""
        ref, keyed, free, cached = self._ref, self._key_of, self._free, self._evictable
        for page in pages:
            r = ref[page] - 1
            if r < 0 or page <= 0:
                raise AssertionError(f"double free of page {page}")
            ref[page] = r
            if not r:
                if page in keyed:
                    cached[page] = None
                    if stale:
                        cached.move_to_end(page, last=False)
                else:
                    free.append(page)

    def check(self) -> None:
        """Assert the state invariants (used by tests): every page in exactly one state."""
        free, cached = set(self._free), set(self._evictable)
        assert len(free) == len(self._free) and not free & cached and 0 not in free | cached
        for page in range(1, self.num_pages):
            r = self._ref[page]
            assert r >= 0
            assert (page in free) == (r == 0 and page not in self._key_of), page
            assert (page in cached) == (r == 0 and page in self._key_of), page
        assert all(self._page_of[k] == p for p, k in self._key_of.items())
        assert len(self._page_of) == len(self._key_of)
