"""The KV cache manager: the only object that touches the page pools.

Role: turn "sequence ``s`` computes tokens ``[t0, t1)`` this step" into a :class:`WritePlan`
(pages allocated, slots for the new tokens, demotions, the prefix the chunk attends to), and
after the step commit it (register content keys, release demoted BF16 pages). It also
serves prefix-cache hits and frees preempted or finished sequences. The scheduler talks only
to this class (the pools sit behind it, as in vLLM v1); the model runner turns the plans of a
step into tensors (``oscarkv.engine.model_runner``).

Tier rule (DESIGN.md §3, :func:`oscarkv.quant.bpe.history_end`): after a step a sequence of
``t1`` tokens holds sink ``[0, S0)`` and recent ``[h(t1), t1)`` in BF16 pages, history
``[S0, h(t1))`` in INT2 pages. Every new token is first written to a BF16 page; pages that the
new length sends to history are then encoded into INT2 pages by the attention backend
(``demote``) — prompt middles included, so an INT2 page always holds ``encode`` of BF16
values (the OscarCache rule) and the BF16 copy survives as a cached page for prefix hits.
For ``kv=bf16`` nothing is demoted: every token past the sink lives in the recent list.

A chunk's prefix view is the cache *after* the step's demotions restricted to positions
``< t0`` (OscarCache writes first, then reads). NOTE: this needs no INT2 page to mix prefix
tokens with chunk tokens; chunks start on page boundaries except decode steps, for which
``EngineConfig`` requires ``recent >= 1`` (or ``P = 1``), and explicit chunk schedules are
checked by :meth:`KVCacheManager.check_schedule`.

Prefix-cache events (``oscarkv.cache.events``): :meth:`KVCacheManager.watch` adds an observer told
when a page key is first held by the BF16 or INT2 pool and when its last copy is evicted.

Sliding-window layers (Gemma 3): the pools above serve only the global layers; the sliding
layers' bounded BF16 windows are the manager's :class:`~oscarkv.cache.window.WindowCache`
(``window``), planned, committed, freed and matched in the same calls (``WritePlan.window``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Protocol

import numpy as np

from oscarkv.cache.events import BlockTracker, CacheObserver
from oscarkv.cache.page_pool import PagePool
from oscarkv.cache.seq_kv import ChunkSchedule, SeqKV
from oscarkv.cache.window import WindowCache, WindowPlan
from oscarkv.config import KVConfig
from oscarkv.quant.bpe import history_end, history_ends


class CachedSequence(Protocol):
    """What the manager reads from a sequence (``oscarkv.engine.sequence.Sequence``)."""

    kv: SeqKV
    token_ids: list[int]
    schedule: ChunkSchedule


@dataclass
class WritePlan:
    """One sequence's cache work for one step (made by :meth:`KVCacheManager.plan`)."""

    t0: int
    t1: int
    slots: list[int]  # [t1 - t0] flat BF16 slots page * P + offset of the new tokens
    demote_src: list[int] = field(default_factory=list)  # BF16 pages to encode ...
    demote_dst: list[int] = field(default_factory=list)  # ... into these INT2 pages
    view_bf16: list[int] = field(default_factory=list)  # BF16 pages of the prefix view (sink, then recent)
    view_bf16_len: int = 0
    view_int2: list[int] = field(default_factory=list)  # INT2 pages of the prefix view
    register: list[tuple[str, int, int]] = field(default_factory=list)  # (pool, page, page index) to key
    release: list[int] = field(default_factory=list)  # BF16 pages to release after the step (a prefix hit's) ...
    release_stale: list[int] = field(default_factory=list)  # ... and those evicted first (the step's own demoted)
    window: WindowPlan | None = None  # the sliding layers' share (models with sliding layers only)
    after_hit: bool = False  # the first step after a prefix-cache hit (a follow-up's; rank 0's, not sent)


class KVCacheManager:
    """Pools, tier bookkeeping and prefix caching (see the module docstring)."""

    def __init__(self, kv: KVConfig, bf16: PagePool, int2: PagePool | None, prefix_caching: bool = True,
                 window: WindowCache | None = None) -> None:
        self.kv, self.bf16, self.int2, self.window = kv, bf16, int2, window
        self.prefix_caching = prefix_caching
        self.P = kv.page_size
        self.hit_tokens = 0  # prompt tokens served from the prefix cache (a statistic)
        self.blocks: BlockTracker | None = None  # the keys held, once an observer watches

    def watch(self, observer: CacheObserver) -> None:
        """Tell ``observer`` of every page key that becomes held or stops being held from now on."""
        if self.blocks is None:
            self.blocks = BlockTracker()
            for pool in (self.bf16, self.int2):
                if pool is not None:
                    pool.on_evict.append(self.blocks.evicted)
        self.blocks.observers.append(observer)

    @property
    def quantized(self) -> bool:
        return self.int2 is not None

    def hist_end(self, t: int) -> int:
        """End of the INT2 history for ``t`` tokens, at least the sink's end (``S0`` for ``kv=bf16``)."""
        if not self.quantized:
            return self.kv.sink
        return max(self.kv.sink, history_end(t, self.kv.sink, self.kv.recent, self.P))

    def hist_ends(self, t: np.ndarray) -> np.ndarray:
        """:meth:`hist_end` of every length in the integer array ``t``."""
        if not self.quantized:
            return np.full_like(t, self.kv.sink)
        return np.maximum(self.kv.sink, history_ends(t, self.kv.sink, self.kv.recent, self.P))

    def check_schedule(self, schedule: ChunkSchedule) -> None:
        """Raise if a prefill chunk would demote a page holding tokens of both its prefix and itself."""
        for t0 in schedule.starts():
            first = t0 - t0 % self.P  # the page holding t0 mixes prefix and chunk tokens
            if t0 % self.P and first >= self.kv.sink and self.hist_end(schedule.end(t0)) > first:
                raise ValueError(f"chunk [{t0}, {schedule.end(t0)}) starts inside a page that it demotes to INT2; "
                                 f"start chunks on multiples of page_size ({self.P}) or keep them shorter than the recent window")

    def pages_needed(self, schedule: ChunkSchedule, num_tokens: int) -> tuple[int, int, int]:
        """(BF16, INT2, window) pages one sequence holds at most while it computes ``num_tokens`` tokens
        alone: the prefill chunks of ``schedule``, then one token per step (what :meth:`plan`
        allocates before :meth:`commit` releases demoted pages; no prefix sharing)."""
        P, W = self.P, self.kv.recent
        # NOTE: once the recent window is full, a decode step's BF16 need repeats with period P,
        # and before that it only grows, so the last W + 2P steps hold the maximum.
        first = max(schedule.prompt_len + 1, num_tokens - W - 2 * P)
        starts, ends = np.array(schedule.starts(), dtype=np.int64), np.arange(first, num_tokens + 1, dtype=np.int64)
        t0, t1 = np.concatenate([starts, ends - 1]), np.concatenate([schedule.ends(starts), ends])
        bf16 = int(self._bf16_pages_in_steps(t0, t1).max())
        int2 = (self.hist_end(num_tokens) - self.kv.sink) // P if self.quantized else 0
        window = max(self.window.pages_in_step(int(a), int(b)) for a, b in zip(t0, t1)) if self.window else 0
        return bf16, int2, window

    def _bf16_pages_in_steps(self, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """BF16 pages held during each step ``[t0[i], t1[i])``: the sink's, then the recent ones from the history end
        at ``t0`` to ``t1``, before demotion (a 100K-token prompt has 1,600 chunks: admission checks them all)."""
        S0, P = self.kv.sink, self.P
        recent = np.where(t1 > S0, -(-(t1 - self.hist_ends(t0)) // P), 0)  # [h(t0), t1) before demotion
        return -(-np.minimum(t1, S0) // P) + recent

    # ------------------------------------------------------------------------- a step
    def _new_pages(self, s: SeqKV, t1: int) -> tuple[int, int, int]:
        """(sink, recent, demoted) pages that extending ``s`` to ``t1`` tokens allocates."""
        P, S0 = self.P, self.kv.sink
        h0 = S0 + len(s.history) * P  # recent page 0 starts here
        n_sink = -(-min(t1, S0) // P) - len(s.sink)
        n_recent = max(0, -(-(t1 - h0) // P) - len(s.recent)) if t1 > S0 else 0
        return n_sink, n_recent, (self.hist_end(t1) - h0) // P

    def fits(self, seqs: list[CachedSequence], t1s: list[int]) -> bool:
        """Whether :meth:`plan` of every ``seqs[i]`` to ``t1s[i]`` together would succeed (nothing changes).
        NOTE: counts every demotion as a new INT2 page (a prefix-cache hit only needs fewer)."""
        bf16 = int2 = win = 0
        for seq, t1 in zip(seqs, t1s):
            n_sink, n_recent, n_demote = self._new_pages(seq.kv, t1)
            bf16, int2 = bf16 + n_sink + n_recent, int2 + n_demote
            win += self.window.new_pages(seq.kv.window, t1) if self.window else 0
        return (bf16 <= self.bf16.num_available and (not int2 or int2 <= self.int2.num_available)
                and (not win or win <= self.window.pool.num_available))

    def plan(self, seq: CachedSequence, t1: int) -> WritePlan | None:
        """Allocate for tokens ``[num_tokens, t1)``; ``None`` (nothing changed) when the pools are short."""
        s, P = seq.kv, self.P
        t0, h0, h1 = s.num_tokens, self.kv.sink + len(s.history) * P, self.hist_end(t1)  # h0: recent page 0 starts here
        n_sink, n_recent, n_demote = self._new_pages(s, t1)
        if self.bf16.num_available < n_sink + n_recent or (n_demote and self.int2.num_available < n_demote):
            return None
        if self.window and self.window.pool.num_available < self.window.new_pages(s.window, t1):
            return None
        s.sink += [self.bf16.allocate() for _ in range(n_sink)]
        s.recent += [self.bf16.allocate() for _ in range(n_recent)]
        plan = WritePlan(t0, t1, [self._slot(s, p, h0) for p in range(t0, t1)], after_hit=t0 == s.hit_pages * P > 0)
        plan.register = [("bf16", self._bf16_page(s, i, h0), i) for i in range(t0 // P, t1 // P)]
        self._demote(seq, plan, h0, n_demote)
        s.num_tokens = t1
        self._view(s, plan, t0, h1)
        if self.window:
            plan.window = self.window.plan(s.window, t0, t1)
        return plan

    # ------------------------------------------------------------------------- speculative steps
    def draft_end(self, seq: CachedSequence, t1: int, limit: int) -> int:
        """The longest extension ``[t1, t) ⊆ [t1, limit)`` of a decode step to ``t1`` by drafted tokens
        (``oscarkv.engine.speculative``) that :meth:`truncate` can roll back without a trace: the tiers at
        ``t`` are those at ``t1`` (no draft makes a demotion), no sliding layers, and the draft pages come
        from the free list (none evicts a cached page)."""
        if self.window is not None:
            return t1
        h, room = self.hist_end(t1), max(self._bf16_new(seq, t1), self.bf16.num_free)
        lo, hi = t1, max(t1, limit)
        while lo < hi:  # NOTE: a bisection: both conditions hold up to a length, then never (tiers and pages only
            mid = (lo + hi + 1) // 2  # grow with it); the scheduler's limit is the step's token budget, not K
            if self.hist_end(mid) == h and self._bf16_new(seq, mid) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _bf16_new(self, seq: CachedSequence, t1: int) -> int:
        return sum(self._new_pages(seq.kv, t1)[:2])

    def truncate(self, seq: CachedSequence, plan: WritePlan, t1: int) -> None:
        """Shorten ``plan`` (planned, not committed) to end at ``t1``: tokens ``[t1, plan.t1)`` were rejected
        drafts. Their pages go back to the free list (their slots are never read: every later token is
        written before it is read) and no page they fill is keyed. NOTE: ``plan.t1`` came from
        :meth:`draft_end`, so the step's demotions are those of a step to ``t1``."""
        s, P = seq.kv, self.P
        assert plan.t0 < t1 <= plan.t1 == s.num_tokens and self.hist_end(t1) == self.hist_end(plan.t1)
        h0 = self.kv.sink + len(s.history) * P  # recent page 0 starts here (after the step's demotions)
        n_sink = -(-min(t1, self.kv.sink) // P)
        n_recent = -(-(t1 - h0) // P) if t1 > h0 else 0
        self.bf16.release_all(s.sink[n_sink:] + s.recent[n_recent:])
        s.sink, s.recent, s.num_tokens = s.sink[:n_sink], s.recent[:n_recent], t1
        plan.t1, plan.slots = t1, plan.slots[:t1 - plan.t0]
        plan.register = [r for r in plan.register if r[0] == "int2" or (r[2] + 1) * P <= t1]

    def _slot(self, s: SeqKV, pos: int, h0: int) -> int:
        if pos < self.kv.sink:
            return s.sink[pos // self.P] * self.P + pos % self.P
        return s.recent[(pos - h0) // self.P] * self.P + (pos - h0) % self.P

    def _bf16_page(self, s: SeqKV, index: int, h0: int) -> int:
        pos = index * self.P
        return s.sink[index] if pos < self.kv.sink else s.recent[(pos - h0) // self.P]

    def _demote(self, seq: CachedSequence, plan: WritePlan, h0: int, n: int) -> None:
        """Move the ``n`` oldest recent pages to history: reuse a cached INT2 page or encode one."""
        s = seq.kv
        for k in range(n):
            index, src = h0 // self.P + k, s.recent[k]
            dst = self.int2.lookup(self._key(seq, index)) if self.prefix_caching else None
            if dst is None:
                dst = self.int2.allocate()
                plan.demote_src.append(src)
                plan.demote_dst.append(dst)
                plan.register.append(("int2", dst, index))
            s.history.append(dst)
            (plan.release if index < s.hit_pages else plan.release_stale).append(src)
        s.recent = s.recent[n:]

    def _view(self, s: SeqKV, plan: WritePlan, t0: int, h1: int) -> None:
        """The prefix ``[0, t0)`` as stored at the new length: sink, recent from ``h1``, history."""
        P, S0 = self.P, self.kv.sink
        n_sink = min(t0, S0)
        plan.view_bf16 = s.sink[: -(-n_sink // P)]
        plan.view_bf16_len = n_sink
        if t0 > h1:
            plan.view_bf16 = plan.view_bf16 + s.recent[: -(-(t0 - h1) // P)]
            plan.view_bf16_len += t0 - h1
        n_hist = (min(h1, t0 - t0 % P) - S0) // P
        plan.view_int2 = s.history[:max(0, n_hist)]

    def commit(self, seq: CachedSequence, plan: WritePlan) -> None:
        """After the step ran: key the pages that became full, release demoted BF16 pages."""
        if self.prefix_caching:
            for pool, page, index in plan.register:
                key = self._key(seq, index)
                if (self.bf16 if pool == "bf16" else self.int2).register(page, key) and self.blocks is not None:
                    P = self.P
                    parent = self._key(seq, index - 1) if index else None
                    self.blocks.added(key, parent, seq.token_ids[index * P:(index + 1) * P])
        self.bf16.release_all(plan.release)  # NOTE: a hit's pages, a point some request reached (a chat's turn)
        self.bf16.release_all(plan.release_stale, stale=True)  # evicted before any other cached page
        if plan.window:
            self.window.commit(plan.window, (lambda i: self._key(seq, i)) if self.prefix_caching else None)

    def abandon(self, plan: WritePlan) -> None:
        """The step of ``plan`` failed before :meth:`commit`: release the BF16 pages its
        demotions took off the sequence (and the window pages it aged out), keying nothing (the
        step's writes may be partial). The sequence itself must then be freed (:meth:`free`): its
        pages are not trustworthy."""
        self.bf16.release_all(plan.release + plan.release_stale)
        if plan.window:
            self.window.abandon(plan.window)

    def _key(self, seq: CachedSequence, index: int) -> bytes:
        return seq.kv.key(index, seq.token_ids, seq.schedule, self.P, self.hist_ends)

    # ------------------------------------------------------------------------- whole sequences
    def free(self, seq: CachedSequence) -> None:
        """Release every page of ``seq`` (finished or preempted); keyed pages stay cached, the last ones first: an
        allocation evicts the least recently released, so a prefix's tail goes before its head (the sink pages
        every hit of the prefix needs; released first, a cold prompt after a turn on a document evicted them and
        the next turn hit nothing)."""
        s = seq.kv
        self.bf16.release_all(s.recent[::-1] + s.sink[::-1])
        if s.history:
            self.int2.release_all(s.history[::-1])
        if self.window:
            self.window.free(s.window)
        s.reset()

    def match_prefix(self, seq: CachedSequence) -> int:
        """Adopt the longest cached prefix that ends where a chunk starts; return its length.

        The hit must restore the exact state a cold run has there: sink and recent pages in
        BF16, history in INT2. If the BF16 copy of a window was evicted, a shorter prefix is
        tried (and the rest recomputed — exactly, since chunks replay as in a cold run).
        NOTE: one pass: the keys of the longest candidate once (:meth:`SeqKV.prefix_keys`), a miss
        count per pool and page, then each candidate in O(1) (its window pages aside)."""
        if not self.prefix_caching or seq.kv.num_tokens:
            return 0
        P = self.P
        starts = [t for t in seq.schedule.starts() if t and t % P == 0]
        if not starts:
            return 0
        keys = seq.kv.prefix_keys(starts[-1] // P, seq.token_ids, seq.schedule, P, self.hist_ends)
        bf16_miss, int2_miss = _misses(self.bf16, keys), _misses(self.int2, keys)
        S0 = self.kv.sink // P
        for t in reversed(starts):
            n, h = t // P, self.hist_end(t) // P
            s, r = min(S0, n), max(min(h, n), min(S0, n))  # sink pages [0, s), history [s, r), recent [r, n)
            ok = bf16_miss[s] == 0 and bf16_miss[n] == bf16_miss[r] and (r == s or int2_miss[r] == int2_miss[s])
            if ok and (not self.window or all(self.window.pool.peek(keys[i]) for i in self.window.prefix_indices(t))):
                self._adopt(seq, keys[:n], (s, r))
                self._keep_restore_points(keys, t, seq.schedule.chunk)
                self.hit_tokens += t
                return t
        return 0

    def _keep_restore_points(self, keys: list[bytes], hit: int, chunk: int) -> None:
        """Mark recently used, at the two multiples of ``chunk`` (the prefill chunk) below a ``hit`` (keys ``keys``),
        the cached pages a hit there needs besides the history: the BF16 recent window and the sliding layers' window
        pages. There a request finds its longest hit when it shares the prefix but not the hit's chunk starts (a new
        conversation on the document of a chat that resumes at its turns; two points cover a question of up to a
        chunk between the document and the hit). NOTE: nothing else reads those pages once demoted (or slid past):
        without this, the pages the chat's turns allocate evict them and such a request recomputes the whole prefix
        (a 33K document after six 512-token follow-ups)."""
        for t in (hit // chunk * chunk - chunk, hit // chunk * chunk):  # the later point touched last: evicted last
            if t <= 0 or t % self.P:
                continue
            if self.window:
                for i in self.window.prefix_indices(t):
                    self.window.pool.touch(keys[i])
            if self.quantized:
                n, s = t // self.P, min(self.kv.sink // self.P, t // self.P)
                for key in keys[max(min(self.hist_end(t) // self.P, n), s):n]:
                    self.bf16.touch(key)

    def _adopt(self, seq: CachedSequence, keys: list[bytes], tiers: tuple[int, int]) -> None:
        """Take the cached pages of ``keys`` (all held): ``[0, s)`` sink, ``[s, r)`` history, the rest recent."""
        s, (a, b) = seq.kv, tiers
        s.sink = self.bf16.lookup_all(keys[:a])
        s.history = self.int2.lookup_all(keys[a:b]) if b > a else []
        s.recent = self.bf16.lookup_all(keys[b:])
        t = len(keys) * self.P
        if self.window:
            self.window.adopt(s.window, t, lambda i: keys[i])
        s.num_tokens, s.hit_pages = t, len(keys)

    def tier_tokens(self, seq: CachedSequence) -> tuple[int, int, int]:
        """(sink, history, recent) tokens held, from the page lists (tests compare with ``tiers``)."""
        s = seq.kv
        sink = min(s.num_tokens, self.kv.sink)
        hist = len(s.history) * self.P
        return sink, hist, s.num_tokens - sink - hist


def _misses(pool: PagePool | None, keys: list[bytes]) -> list[int]:
    """``m[i]``: how many of ``keys[:i]`` ``pool`` does not hold (``m[0] = 0``; all missing without a pool)."""
    if pool is None:
        return list(range(len(keys) + 1))
    return [0, *accumulate(map(operator.not_, pool.holds(keys)))]
