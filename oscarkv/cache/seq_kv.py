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
from dataclasses import dataclass, field

from oscarkv.cache.window import WindowKV


@dataclass(frozen=True)
class ChunkSchedule:
    """Where a sequence's chunks end: prefill chunks, then one token per step."""

    prompt_len: int
    chunk: int  # EngineConfig.prefill_chunk
    boundaries: tuple[int, ...] = ()  # explicit prefill chunk ends inside the prompt (sorted)

    def end(self, t0: int) -> int:
        """End (exclusive) of the chunk that starts at position ``t0``."""
        if t0 >= self.prompt_len:
            return t0 + 1  # decode (or the replay of a generated token)
        if self.boundaries:
            return next((b for b in self.boundaries if b > t0), self.prompt_len)
        return min((t0 // self.chunk + 1) * self.chunk, self.prompt_len)

    def starts(self) -> list[int]:
        """Start positions of the prefill chunks, ascending."""
        out, t = [], 0
        while t < self.prompt_len:
            out.append(t)
            t = self.end(t)
        return out

    def salt(self) -> bytes:
        """Distinguishes explicit schedules in page keys (canonical ones need no salt)."""
        return repr(self.boundaries).encode() if self.boundaries else b""


def page_key(prev: bytes, tokens: list[int], chunk_ends: tuple[int, int], salt: bytes) -> bytes:
    """Content key of a full page: hash of the previous key, its tokens and how they were computed.

    ``chunk_ends`` are the ends of the chunks that computed the page's first and last token;
    together with the positions (implied by the chain) they determine every token's chunk."""
    h = hashlib.sha256(prev)
    h.update(repr((tokens, chunk_ends)).encode())
    h.update(salt)
    return h.digest()


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
        while len(self.keys) <= index:
            i = len(self.keys)
            lo, hi = i * page, (i + 1) * page
            assert hi <= len(tokens), "page key of a page whose tokens are not known yet"
            prev = self.keys[-1] if self.keys else b""
            ends = (schedule.end(_chunk_start(schedule, lo)), schedule.end(_chunk_start(schedule, hi - 1)))
            self.keys.append(page_key(prev, tokens[lo:hi], ends, schedule.salt()))
        return self.keys[index]

    def reset(self) -> None:
        self.sink, self.history, self.recent, self.num_tokens = [], [], [], 0
        self.window.reset()


def _chunk_start(schedule: ChunkSchedule, pos: int) -> int:
    """Start of the chunk holding ``pos``."""
    if pos >= schedule.prompt_len:
        return pos
    if schedule.boundaries:
        return max((b for b in schedule.boundaries if b <= pos), default=0)
    return pos // schedule.chunk * schedule.chunk
