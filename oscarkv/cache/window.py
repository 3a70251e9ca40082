"""The bounded window store of sliding-window layers (Gemma 3): per-sequence pages freed as they age out.

Role: the part of :class:`~oscarkv.cache.manager.KVCacheManager` that serves the sliding layers
(:class:`~oscarkv.quant.bpe.SlidingLayers`). Their K/V live in a pool of their own (the window
pool of :class:`~oscarkv.cache.kv_pools.KVPools`: ``[L_sliding, N_window, H, P, d]`` in the window
dtype, never rotated, never INT2), addressed by page ids of a :class:`PagePool` of their own; the
global layers keep the tiers of DESIGN.md §3 in the main pools. A window page id addresses the same
page in every sliding layer.

Per sequence (:class:`WindowKV`): the pages covering positions ``[first·P, t)``. Query ``p`` of a
sliding layer reads keys ``(p − W, p]``, so once ``t`` tokens are stored no future query reads a
position below ``t − W + 1``: after each step the pages wholly below
:func:`~oscarkv.quant.bpe.window_start` are released. A sequence therefore holds at most
``W + P − 2`` tokens between steps and ``W + P − 2 + chunk`` during one (its new pages), whatever its
length: the memory of a sliding layer does not grow with the context.

A step's view (:class:`WindowPlan`) is the held pages before the chunk, from ``view_start`` (a page
boundary, so the stale head of the first page is masked by attention, not stored apart). Attention
is banded: :meth:`~oscarkv.attention.step.AttentionBackend.extend_window`.

Prefix caching: a full window page is keyed like a main-pool page (the content key of
:mod:`oscarkv.cache.seq_kv`: its tokens, its prefix and the chunks that computed it) and stays
cached after it ages out (LRU, :class:`PagePool`). A hit at ``t`` needs the main pools' pages of
``[0, t)`` and the window pages of ``[window_start(t), t)``; the bytes are those of a cold run, so
a hit produces the cold run's tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from oscarkv.cache.page_pool import PagePool
from oscarkv.quant.bpe import SlidingLayers, window_start


@dataclass
class WindowKV:
    """One sequence's window pages: ``pages[i]`` holds positions ``[(first + i)·P, (first + i + 1)·P)``."""

    pages: list[int] = field(default_factory=list)
    first: int = 0  # page index (position // P) of pages[0]

    def reset(self) -> None:
        self.pages, self.first = [], 0


@dataclass
class WindowPlan:
    """One sequence's window work for one step (made by :meth:`WindowCache.plan`)."""

    slots: list[int]  # [t1 - t0] flat window-pool slots page * P + offset of the new tokens
    view: list[int]  # window pages of the prefix view [view_start, t0)
    view_start: int  # position of the view's first token (a page boundary)
    view_len: int  # t0 - view_start
    register: list[tuple[int, int]] = field(default_factory=list)  # (page, page index) to key after the step
    release: list[int] = field(default_factory=list)  # pages that aged out, released after the step


class WindowCache:
    """Window pages of every sequence (see the module docstring)."""

    def __init__(self, sliding: SlidingLayers, page_size: int, pool: PagePool) -> None:
        self.sliding, self.P, self.pool = sliding, page_size, pool

    @property
    def window(self) -> int:
        return self.sliding.window

    def _held(self, w: WindowKV, t: int) -> int:
        """Pages covering ``[first·P, t)``."""
        return max(0, -(-t // self.P) - w.first)

    def new_pages(self, w: WindowKV, t1: int) -> int:
        """Pages that extending ``w`` to ``t1`` tokens allocates."""
        return self._held(w, t1) - len(w.pages)

    def plan(self, w: WindowKV, t0: int, t1: int) -> WindowPlan:
        """Allocate for ``[t0, t1)`` (the caller checked :meth:`new_pages` against the pool), give the view of
        ``[view_start, t0)`` and age out the pages below ``window_start(t1)`` (released at commit)."""
        P = self.P
        w.pages += [self.pool.allocate() for _ in range(self.new_pages(w, t1))]
        start = max(window_start(t0, self.window, P), w.first * P)
        lo = start // P - w.first
        plan = WindowPlan([w.pages[p // P - w.first] * P + p % P for p in range(t0, t1)],
                          w.pages[lo:self._held(w, t0)] if t0 > start else [], start, t0 - start)
        plan.register = [(w.pages[i - w.first], i) for i in range(t0 // P, t1 // P)]
        old = window_start(t1, self.window, P) // P - w.first
        if old > 0:
            plan.release, w.pages, w.first = w.pages[:old], w.pages[old:], w.first + old
        return plan

    def commit(self, plan: WindowPlan, key: Callable[[int], bytes] | None) -> None:
        """After the step ran: key the pages that became full (``key``: page index → content key; ``None``
        without prefix caching), then release the pages that aged out."""
        for page, index in plan.register if key is not None else ():
            self.pool.register(page, key(index))
        self.abandon(plan)

    def abandon(self, plan: WindowPlan) -> None:
        """Release the pages that aged out, keying nothing (the step failed before :meth:`commit`)."""
        for page in plan.release:
            self.pool.release(page)

    def free(self, w: WindowKV) -> None:
        self.pool.release_all(w.pages)
        w.reset()

    def prefix_indices(self, t: int) -> range:
        """Page indices a prefix hit at ``t`` (a page boundary) needs."""
        return range(window_start(t, self.window, self.P) // self.P, t // self.P)

    def adopt(self, w: WindowKV, t: int, key: Callable[[int], bytes]) -> None:
        """Take the cached pages of a hit at ``t`` (all present: :meth:`prefix_indices` peeked)."""
        idx = self.prefix_indices(t)
        w.pages, w.first = [self.pool.lookup(key(i)) for i in idx], idx.start

    def pages_in_step(self, t0: int, t1: int) -> int:
        """Pages one sequence holds while it computes ``[t0, t1)`` (before the step's release)."""
        return -(-t1 // self.P) - window_start(t0, self.window, self.P) // self.P
