"""Per-sequence tier state, the chunk schedule, and the content keys of full pages.

Role: what the cache manager knows about one sequence. :class:`SeqKV` holds its page ids per
tier (sink and recent window in the BF16 pool, history in the INT2 pool) and the number of
tokens stored; :class:`ChunkSchedule` fixes where its prefill chunks end.

Why the schedule is part of a page's identity: a prefill chunk attends to itself at full
precision and to its prefix *as stored* (DESIGN.md §3), so a token's K/V — and hence the
bytes of its page — depend on which chunk computed it, not only on the tokens before it.
Chunk ends are therefore a fixed function of the position (multiples of
``EngineConfig.prefill_chunk``, the prompt's end, then one token per decode step, or an
explicit list a request asks for), and a page's key hashes the previous page's key, its
tokens and the chunk ends that computed them. Two pages with equal keys hold equal bytes;
that is what makes a prefix-cache hit, and a preempted request's replay, token-identical to
a cold run. The tier (BF16 or INT2) is the pool the key is looked up in.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_right
from collections.abc import Sequence
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

    def end(self, t0: int) -> int:
        """End (exclusive) of the chunk that holds position ``t0`` (starts there, for :meth:`starts`)."""
        if t0 >= self.prompt_len:
            return t0 + 1  # decode (or the replay of a generated token)
        if self.boundaries:
            i = bisect_right(self.boundaries, t0)
            return self.boundaries[i] if i < len(self.boundaries) else self.prompt_len
        return min((t0 // self.chunk + 1) * self.chunk, self.prompt_len)

    def ends(self, pos: np.ndarray) -> np.ndarray:
        """:meth:`end` of every position in ``pos`` (int64, any shape), vectorized."""
        if self.boundaries:
            bounds = np.array(self.boundaries + (self.prompt_len,), dtype=np.int64)  # as :meth:`end`'s bisect
            inside = bounds[np.searchsorted(bounds[:-1], pos, side="right")]
        else:
            inside = np.minimum((pos // self.chunk + 1) * self.chunk, self.prompt_len)
        return np.where(pos >= self.prompt_len, pos + 1, inside)

    def starts(self) -> list[int]:
        """Start positions of the prefill chunks, ascending."""
        if self.boundaries:
            return sorted({0, *(b for b in self.boundaries if 0 < b < self.prompt_len)})
        return list(range(0, self.prompt_len, self.chunk))

    def salt(self) -> bytes:
        """Distinguishes explicit schedules in page keys (canonical ones need no salt)."""
        return repr(self.boundaries).encode() if self.boundaries else b""


def page_keys(prev: bytes, tokens: Sequence[int], pages: range, schedule: ChunkSchedule, page: int) -> list[bytes]:
    """Content keys of the full pages ``pages`` (consecutive), chained from ``prev`` (the key of page
    ``pages.start - 1``, ``b""`` for page 0): key ``i`` = SHA-256 of key ``i - 1``, then page ``i``'s
    tokens and the ends of the chunks that computed its first and last token as int32, then the salt.

    ``tokens`` must cover the pages. The ends together with the positions (implied by the chain)
    determine every token's chunk. NOTE: one int32 record per page built in bulk (numpy), then one
    hash call per page: a 100K-token prompt's 1 600 keys cost about one millisecond."""
    if not pages:
        return []
    P, lo, n = page, pages.start * page, len(pages)
    assert pages.stop * P <= len(tokens), "page key of a page whose tokens are not known yet"
    ids, seg = array("i"), tokens[lo:lo + n * P]
    ids.fromlist(seg if isinstance(seg, list) else list(seg))  # NOTE: fromlist: twice as fast as array("i", seg)
    rec = np.empty((n, P + 2), dtype=np.int32)  # [page, P tokens + first end + last end]
    rec[:, :P] = np.frombuffer(ids, dtype=np.int32).reshape(n, P)
    first = np.arange(lo, lo + n * P, P, dtype=np.int64)
    rec[:, P], rec[:, P + 1] = schedule.ends(first), schedule.ends(first + P - 1)
    buf, size, salt, out = rec.tobytes(), (P + 2) * 4, schedule.salt(), []
    for off in range(0, n * size, size):
        prev = _HASH(prev + buf[off:off + size] + salt).digest()
        out.append(prev)
    return out


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
    window: WindowKV = field(default_factory=WindowKV)  # the sliding layers' pages (oscarkv.cache.window)

    def key(self, index: int, tokens: list[int], schedule: ChunkSchedule, page: int) -> bytes:
        """Content key of full page ``index``; ``tokens`` must cover it."""
        return self.keys[index] if index < len(self.keys) else self.prefix_keys(index + 1, tokens, schedule, page)[index]

    def prefix_keys(self, n: int, tokens: list[int], schedule: ChunkSchedule, page: int) -> list[bytes]:
        """Content keys of full pages ``0 .. n - 1`` (the missing ones computed in one batch, then kept)."""
        if len(self.keys) < n:
            self.keys += page_keys(self.keys[-1] if self.keys else b"", tokens, range(len(self.keys), n), schedule, page)
        return self.keys[:n] if len(self.keys) > n else self.keys

    def reset(self) -> None:
        self.sink, self.history, self.recent, self.num_tokens = [], [], [], 0
        self.window.reset()

