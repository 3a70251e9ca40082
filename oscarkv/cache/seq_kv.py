"""Per-sequence tier state, the chunk schedule, and the content keys of full pages.

Role: what the cache manager knows about one sequence. :class:`SeqKV` holds its page ids per
tier (sink and recent window in the BF16 pool, history in the INT2 pool) and the number of
tokens stored; :class:`ChunkSchedule` fixes where its prefill chunks end.

Why the schedule is part of a page's identity: a prefill chunk attends to itself at full
precision and to its prefix *as stored* (DESIGN.md §3), so a token's K/V — and hence the
bytes of its page — depend on which chunk computed it, not only on the tokens before it.
Chunk ends are therefore a fixed function of the request (multiples of
``EngineConfig.prefill_chunk``, the prompt's end and the request's resume points, then one token per
decode step, or an explicit list a request asks for), and a page's key hashes the previous page's key,
its tokens, and for each token its chunk's start and the tiers at that chunk's end. Two pages with equal keys hold equal bytes;
that is what makes a prefix-cache hit, and a preempted request's replay, token-identical to
a cold run. The tier (BF16 or INT2) is the pool the key is looked up in.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from oscarkv.cache.window import WindowKV

_HASH = hashlib.sha256  # NOTE: faster than blake2b on CPUs with SHA extensions; 32-byte keys (kv_events)


@dataclass(frozen=True)
class ChunkSchedule:
    """Where a sequence's chunks end: prefill chunks, then one token per step."""

    prompt_len: int
    chunk: int  # EngineConfig.prefill_chunk
    boundaries: tuple[int, ...] = ()  # explicit prefill chunk ends inside the prompt (sorted)
    resume: tuple[int, ...] = ()  # anchors of chunk runs beside 0 (sorted; canonical schedules only)
    """Where an earlier request's prompt ended, rounded down to a page (``Admission.validate``'s ``resume``): a chunk
    starts there, so the cached pages of that request's last, partial chunk are hits (their K/V depend on the
    chunk's start and on the tiers at its end, which a page-aligned start inside the same page keeps), and the
    chunks after it are ``chunk`` long from there (a follow-up of up to ``chunk`` tokens is one chunk: a function
    of the prompt, so a later turn that resumes at the same points reproduces them)."""

    def __post_init__(self) -> None:
        if self.boundaries and self.resume:
            raise ValueError("ChunkSchedule: explicit chunk ends (chunk_ends) and resume points do not combine")

    def end(self, t0: int) -> int:
        """End (exclusive) of the chunk that holds position ``t0`` (starts there, for :meth:`starts`)."""
        if t0 >= self.prompt_len:
            return t0 + 1  # decode (or the replay of a generated token)
        if self.boundaries:
            i = bisect_right(self.boundaries, t0)
            return self.boundaries[i] if i < len(self.boundaries) else self.prompt_len
        i = bisect_right(self.resume, t0)
        a = self.resume[i - 1] if i else 0  # the anchor of t0's run of chunks
        end = min(a + ((t0 - a) // self.chunk + 1) * self.chunk, self.prompt_len)
        return min(end, self.resume[i]) if i < len(self.resume) else end

    def ends(self, pos: np.ndarray) -> np.ndarray:
        """:meth:`end` of every position in ``pos`` (int64, any shape), vectorized."""
        bounds = self._bounds()
        inside = bounds[np.minimum(np.searchsorted(bounds, pos, side="right"), len(bounds) - 1)]
        return np.where(pos >= self.prompt_len, pos + 1, inside)

    def starts(self) -> list[int]:
        """Start positions of the prefill chunks, ascending."""
        if self.boundaries:
            return sorted({0, *(b for b in self.boundaries if 0 < b < self.prompt_len)})
        anchors = [0, *(r for r in self.resume if 0 < r < self.prompt_len), self.prompt_len]
        return [t for a, b in zip(anchors, anchors[1:]) for t in range(a, b, self.chunk)]

    def _bounds(self) -> np.ndarray:
        """:meth:`starts`, then the prompt's end: chunk ``i`` is ``[bounds[i], bounds[i + 1])``."""
        return np.array(self.starts() + [self.prompt_len], dtype=np.int64)

    def runs(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions ``[lo, hi)`` as runs that share a chunk, in order: ``(start, end, length)`` int64 arrays, a
        prompt chunk cut to the range, then each decode position its own run (its start itself, its end the next
        position): per position, the chunk's start and :meth:`ends`, once per run."""
        cut = min(hi, self.prompt_len)
        bounds = self._bounds()
        i0, i1 = np.searchsorted(bounds, lo, side="right") - 1, np.searchsorted(bounds, cut, side="left")
        first, end = (bounds[i0:i1], bounds[i0 + 1:i1 + 1]) if lo < cut else (bounds[:0], bounds[:0])
        length = np.minimum(end, cut) - np.maximum(first, lo)
        tail = np.arange(max(lo, self.prompt_len), hi, dtype=np.int64)
        return (np.concatenate([first, tail]), np.concatenate([end, tail + 1]),
                np.concatenate([length, np.ones_like(tail)]))

    def salt(self) -> bytes:
        """Distinguishes explicit schedules in page keys (canonical ones need no salt)."""
        return repr(self.boundaries).encode() if self.boundaries else b""


def page_keys(prev: bytes, tokens: Sequence[int], pages: range, schedule: ChunkSchedule, page: int,
              tiers: Callable[[np.ndarray], np.ndarray] | None = None) -> list[bytes]:
    """Content keys of the full pages ``pages`` (consecutive), chained from ``prev`` (the key of page
    ``pages.start - 1``, ``b""`` for page 0): key ``i`` = SHA-256 of key ``i - 1``, then page ``i``'s record
    (:func:`page_records`: its tokens, for each token the start of the chunk that computed it and ``tiers`` of that
    chunk's end), then the salt.

    A token's K/V are a function of the tokens up to it, its chunk's start (what it reads at full precision) and
    the tiers at its chunk's end (how it reads the prefix before that start), given the keys before it: so equal
    keys mean equal bytes, and a chunk that ends elsewhere with the same tiers shares its pages.
    ``tokens`` (a sequence of ints or an int32 array) must cover the pages. NOTE: the records are built in bulk
    (numpy), then one hash call per page: a 100K-token prompt's 6 400 keys (pages of 16) cost ~4 ms on a 2-core
    CPU (:class:`KeyMemo` spares a follow-up turn most of them)."""
    if not pages:
        return []
    return chain_keys(prev, page_records(tokens, pages, schedule, page, tiers), schedule.salt())


def page_records(tokens: Sequence[int], pages: range, schedule: ChunkSchedule, page: int,
                 tiers: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """What :func:`page_keys` hashes of each page: ``[len(pages), 3 · page]`` int32, per page its tokens, each
    token's chunk start and the tiers at that chunk's end (``tiers``; ``None``: the end itself)."""
    P, lo, n = page, pages.start * page, len(pages)
    assert pages.stop * P <= len(tokens), "page key of a page whose tokens are not known yet"
    seg = tokens[lo:lo + n * P]
    if not isinstance(seg, np.ndarray):  # NOTE: an int32 array as Admission passes it needs no conversion
        ids = array("i")
        ids.fromlist(seg if isinstance(seg, list) else list(seg))  # NOTE: fromlist: twice as fast as array("i", seg)
        seg = np.frombuffer(ids, dtype=np.int32)
    first, end, length = schedule.runs(lo, lo + n * P)
    rec = np.empty((n, 3, P), dtype=np.int32)
    rec[:, 0] = seg.reshape(n, P)
    rec[:, 1] = np.repeat(first, length).reshape(n, P)
    rec[:, 2] = np.repeat(end if tiers is None else tiers(end), length).reshape(n, P)
    return rec.reshape(n, 3 * P)


def chain_keys(prev: bytes, records: np.ndarray, salt: bytes) -> list[bytes]:
    """The key chain over ``records`` (:func:`page_records`' rows) from ``prev``."""
    buf, size, out = records.tobytes(), records.shape[1] * records.itemsize, []
    for off in range(0, len(buf), size):
        prev = _HASH(prev + buf[off:off + size] + salt).digest()
        out.append(prev)
    return out


class KeyMemo:
    """The page keys of the last few prompts :class:`~oscarkv.engine.admission.Admission` hashed, with their
    records: a prompt whose first records equal an earlier prompt's takes that prompt's keys up to its first page
    that differs and hashes only the rest (key ``i`` depends on records ``<= i`` and the salt alone, so the keys
    are those :func:`page_keys` gives). A follow-up turn on a cached 100K-token document then hashes its new pages
    only. Holds the last ``size`` prompts (one that the newest extends is dropped);
    thread-safe (a server validates requests on several threads)."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._held: list[tuple[bytes, np.ndarray, list[bytes]]] = []  # (salt, records, keys), newest last
        self._lock = threading.Lock()
        self.reused = 0  # statistics: keys taken from a held prompt instead of hashed

    def keys(self, records: np.ndarray, salt: bytes) -> list[bytes]:
        """The keys of a whole prompt's ``records`` (from page 0) with ``salt``."""
        with self._lock:
            held = list(self._held)
        best, same = None, 0
        for entry in reversed(held):  # NOTE: the newest first; one that holds half the records will do
            if (m := _same_rows(entry, records, salt)) > same:
                best, same = entry, m
                if 2 * same >= len(records):
                    break
        keys = best[2][:same] if best is not None else []
        keys += chain_keys(keys[-1] if keys else b"", records[same:], salt)
        if same == len(records):  # a prefix of a held prompt: nothing new to hold
            with self._lock:
                self.reused += same
            return keys
        covered = best is not None and same == len(best[1])  # the new prompt extends it: it goes
        with self._lock:
            kept = [e for e in self._held if not (covered and e is best)]
            self._held = kept[max(0, len(kept) - self.size + 1):] + [(salt, records, keys)]
            self.reused += same
        return keys


def _same_rows(entry: tuple[bytes, np.ndarray, list[bytes]], records: np.ndarray, salt: bytes) -> int:
    """How many leading rows of ``records`` equal the held ``entry``'s (0 under another salt or page size)."""
    held_salt, held, _ = entry
    m = min(len(held), len(records))
    if held_salt != salt or held.shape[1:] != records.shape[1:] or not m or not np.array_equal(held[0], records[0]):
        return 0
    lo, block = 1, 16
    while lo < m:  # NOTE: blocks that double: prompts that part early (chats sharing a system turn) cost little
        hi = min(lo + block, m)
        differ = np.flatnonzero((held[lo:hi] != records[lo:hi]).any(axis=1))
        if len(differ):
            return lo + int(differ[0])
        lo, block = hi, 2 * block
    return m


@dataclass
class SeqKV:
    """Pages of one sequence. Positions: sink page ``i`` holds ``[iP, (i+1)P)``; history page
    ``j`` holds ``[S0 + jP, S0 + (j+1)P)``; recent page ``k`` holds ``[h + kP, ...)`` with
    ``h = S0 + len(history) * P`` the history end. Only the last BF16 page may be partial."""

    sink: list[int] = field(default_factory=list)  # BF16 pool
    history: list[int] = field(default_factory=list)  # INT2 pool
    recent: list[int] = field(default_factory=list)  # BF16 pool
    num_tokens: int = 0
    keys: list[bytes] = field(default_factory=list)  # keys of full pages 0, 1, ... (computed lazily)
    hit_pages: int = 0  # pages adopted from the prefix cache (the hit's)
    window: WindowKV = field(default_factory=WindowKV)  # the sliding layers' pages (oscarkv.cache.window)

    def key(self, index: int, tokens: list[int], schedule: ChunkSchedule, page: int, tiers=None) -> bytes:
        """Content key of full page ``index``; ``tokens`` must cover it (``tiers``: as :func:`page_keys`)."""
        if index < len(self.keys):
            return self.keys[index]
        return self.prefix_keys(index + 1, tokens, schedule, page, tiers)[index]

    def prefix_keys(self, n: int, tokens: list[int], schedule: ChunkSchedule, page: int, tiers=None) -> list[bytes]:
        """Content keys of full pages ``0 .. n - 1`` (the missing ones computed in one batch, then kept)."""
        if len(self.keys) < n:
            self.keys += page_keys(self.keys[-1] if self.keys else b"", tokens, range(len(self.keys), n), schedule,
                                   page, tiers)
        return self.keys[:n] if len(self.keys) > n else self.keys

    def reset(self) -> None:
        self.sink, self.history, self.recent, self.num_tokens, self.hit_pages = [], [], [], 0, 0
        self.window.reset()

