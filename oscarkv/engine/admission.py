"""Validate a request once: :class:`Admission` turns it into a :class:`ValidRequest` or refuses it.

Role: the engine's only request check. :meth:`Admission.validate` refuses, with a ``ValueError`` that
names the numbers, a request the engine could never run — an empty prompt, prompt + ``max_tokens``
beyond the model's positions, a prefill chunk beyond the step budget or one that demotes its own
page, more KV pages than the pools hold even for it alone — and returns the request with its chunk
schedule. ``LLMEngine.add`` trusts a :class:`ValidRequest` and checks nothing but its id.

Who calls it: :meth:`LLMEngine.add_request <oscarkv.engine.engine.LLMEngine.add_request>` (offline
users), and on the server path ``AsyncEngine.validate`` in a worker thread, from the HTTP handler
before any response starts (a refusal is a 4xx, never a broken stream).

NOTE: reads only the configuration and the pool sizes, which never change, so it runs safely on
another thread than the one that steps the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from oscarkv.cache.manager import KVCacheManager
from oscarkv.cache.seq_kv import ChunkSchedule, KeyMemo, page_records
from oscarkv.config import EngineConfig
from oscarkv.engine.request import SamplingParams
from oscarkv.engine.token_memo import common_prefix


@dataclass(frozen=True)
class ValidRequest:
    """A request the engine can run (made by :meth:`Admission.validate` only); the engine queues it as is."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    schedule: ChunkSchedule
    """Its prefill chunks (``EngineConfig.prefill_chunk`` multiples, or the caller's ``chunk_ends``)."""
    page_keys: tuple[bytes, ...] = ()
    """Content keys of the prompt's full pages (``oscarkv.cache.seq_kv.page_keys``; none without prefix caching):
    hashed here, once per request, so that a prefix match on the engine's thread only looks them up."""


@dataclass(frozen=True)
class Admission:
    """The limits a request is checked against: the engine's configuration, its cache manager (the pool
    sizes and page arithmetic) and the model's positions (``None``: unbounded)."""

    cfg: EngineConfig
    manager: KVCacheManager
    max_model_len: int | None
    turn_marker: tuple[int, ...] = ()
    """The tokens a chat template ends a prompt with before the assistant speaks (:func:`turn_marker`): where they
    occur inside a prompt an earlier turn's prompt ended, a resume point (``EngineConfig.resume_turns``)."""
    lines: LineStarts | None = None
    """Where lines start (``EngineConfig.resume_questions``): a long single-turn prompt also resumes at its last line,
    so another question on the same document, asked in a new chat or as plain text, hits every page before its own
    line (:meth:`question`)."""
    memo: KeyMemo = field(default_factory=KeyMemo, compare=False)
    """The last few prompts' page keys: a follow-up turn hashes only the pages its earlier turn did not have."""
    held: HeldIds = field(default_factory=lambda: HeldIds(), compare=False)
    """The last few prompts as int32 arrays: a follow-up turn converts only its new tokens."""

    def validate(self, request_id: str, prompt_ids: list[int] | tuple[int, ...], params: SamplingParams,
                 chunk_ends: tuple[int, ...] = (), resume: tuple[int, ...] = ()) -> ValidRequest:
        """The request with its chunk schedule, or ``ValueError`` (module docstring). ``resume``: where earlier
        requests' prompts ended inside this one (a follow-up turn): chunks also start there, rounded down to a page,
        so the cached pages of those prompts' last chunks are hits (``ChunkSchedule.resume``)."""
        n, total = len(prompt_ids), len(prompt_ids) + params.max_tokens
        if not n:
            raise ValueError(f"request {request_id}: the prompt is empty")
        if self.max_model_len is not None and total > self.max_model_len:
            raise ValueError(f"request {request_id}: prompt ({n} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"tokens exceeds the model's maximum length of {self.max_model_len} tokens")
        if chunk_ends and resume:
            raise ValueError(f"request {request_id}: chunk_ends and resume do not combine (give one)")
        prompt_ids = tuple(prompt_ids)
        ids = self.held.int32(prompt_ids)  # NOTE: once, for the marker scan and the page keys
        if not chunk_ends and not resume:
            resume = tuple(r for r in turn_ends(ids, self.turn_marker) if r < n) or self.question(ids)
        P = self.cfg.kv.page_size
        starts = tuple(sorted({r - r % P for r in resume if P <= r < n}))
        schedule = ChunkSchedule(n, self.cfg.prefill_chunk, tuple(sorted(chunk_ends)), starts)
        for t0 in schedule.starts():
            if schedule.end(t0) - t0 > self.cfg.max_num_batched_tokens:
                raise ValueError(f"request {request_id}: chunk [{t0}, {schedule.end(t0)}) exceeds "
                                 f"max_num_batched_tokens={self.cfg.max_num_batched_tokens}")
        self.manager.check_schedule(schedule)
        self._check_pages(request_id, schedule, total - 1)  # the last sampled token is never stored
        return ValidRequest(request_id, prompt_ids, params, schedule, self._page_keys(ids, schedule))

    def question(self, ids: np.ndarray) -> tuple[int, ...]:
        """``(p,)``: where the last line of a prompt of at least ``QUESTION_CHUNKS`` chunks begins (before its chat
        template's assistant prefix), if that is two pages or more into its chunk; else ``()``. A cold run pays one
        more step (~10 ms at 100K: ~0.1% of its prefill); the next question on the same document recomputes its own
        line and at most a page before it, not the rest of that chunk (up to ``prefill_chunk`` tokens)."""
        n, C, P, m = len(ids), self.cfg.prefill_chunk, self.cfg.kv.page_size, len(self.turn_marker)
        end = n - m if m and n > m and tuple(ids[n - m:].tolist()) == self.turn_marker else n
        p = self.lines.last(ids, end) if self.lines is not None else None
        return (p,) if p is not None and p >= QUESTION_CHUNKS * C and (p - p % P) % C >= 2 * P else ()

    def _page_keys(self, prompt: np.ndarray, schedule: ChunkSchedule) -> tuple[bytes, ...]:
        if not self.manager.prefix_caching:
            return ()
        P = self.cfg.kv.page_size
        if len(prompt) < P:
            return ()
        records = page_records(prompt, range(len(prompt) // P), schedule, P, self.manager.hist_ends)
        return tuple(self.memo.keys(records, schedule.salt()))

    def _check_pages(self, request_id: str, schedule: ChunkSchedule, num_tokens: int) -> None:
        need = self.manager.pages_needed(schedule, num_tokens)
        window = self.manager.window.pool if self.manager.window else None
        pools = (self.manager.bf16, self.manager.int2, window)
        have = tuple(p.num_pages - 1 if p is not None else 0 for p in pools)  # the scratch page excluded
        if any(n > h for n, h in zip(need, have)):
            win = (f" (and {need[2]} window pages of the {have[2]} the window pool holds)" if window else "")
            raise ValueError(f"request {request_id}: storing {num_tokens} tokens needs {need[0]} BF16 and {need[1]} "
                             f"INT2 KV pages, but the pools hold {have[0]} and {have[1]} pages in all{win}; "
                             "lower max_tokens or raise EngineConfig.kv_memory_bytes")


QUESTION_CHUNKS = 4
"""Prompts shorter than this many prefill chunks get no resume point at their last line (``Admission.question``)."""


@dataclass(frozen=True)
class LineStarts:
    """Which token ids end with a newline and which are special (added: a chat template's), over the vocabulary."""

    newline: np.ndarray  # bool [V]
    special: np.ndarray  # bool [V]

    @classmethod
    def of(cls, tokenizer) -> LineStarts | None:
        """From a tokenizer's vocabulary (a byte-level ``Ċ``, a SentencePiece ``<0x0A>``, a literal newline at a
        token's end); ``None`` without one or where no token ends a line."""
        try:
            vocab = tokenizer.get_vocab()
        except Exception:  # NOTE: a tokenizer-like callable without a vocabulary: no line resume points
            return None
        size = max(vocab.values(), default=-1) + 1
        newline, special = np.zeros(size, dtype=bool), np.zeros(size, dtype=bool)
        newline[[i for s, i in vocab.items() if s.endswith(("\u010a", "\n", "<0x0A>"))]] = True
        added = {*getattr(tokenizer, "all_special_ids", ()), *getattr(tokenizer, "added_tokens_decoder", {})}
        special[[i for i in added if 0 <= i < size]] = True
        return cls(newline, special) if newline.any() else None

    def last(self, ids: np.ndarray, end: int) -> int | None:
        """The last position ``0 < p < end`` whose token is not special and follows one that ends a line."""
        a = np.asarray(ids[:end], dtype=np.int64)
        known = a < len(self.newline)
        nl, sp = np.zeros(len(a), dtype=bool), np.zeros(len(a), dtype=bool)
        nl[known], sp[known] = self.newline[a[known]], self.special[a[known]]
        ok = np.flatnonzero(nl[:-1] & ~sp[1:])
        return int(ok[-1]) + 1 if ok.size else None


class HeldIds:
    """The int32 ids of the last ``size`` prompts :class:`Admission` validated: a prompt that shares its first
    tokens with one of them converts only the rest (a 100K-token follow-up turn: ~1 ms of ``np.fromiter`` on a fast
    CPU core; built on an earlier prompt's list, as clients and :class:`~oscarkv.engine.token_memo.TokenMemo` build
    follow-ups, its ints are the same objects and the comparison runs at pointer speed). Thread-safe."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._held: list[tuple[tuple[int, ...], np.ndarray]] = []
        self._lock = threading.Lock()
        self.reused = 0  # statistics: tokens taken from held arrays

    def int32(self, prompt: tuple[int, ...]) -> np.ndarray:
        with self._lock:
            held = list(self._held)
        n, best, same = len(prompt), None, 0
        for entry in reversed(held):  # NOTE: the newest first; one that holds half the prompt will do
            if entry[0][0] == prompt[0] and (m := common_prefix(entry[0], prompt)) > same:
                best, same = entry, m
                if 2 * same >= n:
                    break
        rest = np.fromiter(prompt[same:], dtype=np.int32, count=n - same)
        arr = np.concatenate((best[1][:same], rest)) if best is not None else rest
        with self._lock:  # NOTE: a prompt this one extends goes (this one holds all of it)
            kept = [h for h in self._held if not (h is best and same == len(h[0]))]
            self._held = kept[max(0, len(kept) - self.size + 1):] + [(prompt, arr)]
            self.reused += same
        return arr


def turn_marker(tokenizer) -> tuple[int, ...]:
    """The tokens ``tokenizer``'s chat template appends for the assistant's turn (its generation prompt, e.g.
    ``<|im_start|>assistant\\n``); ``()`` without a chat template or where that is not a plain suffix."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return ()
    try:
        turn = [{"role": "user", "content": "x"}]
        bare, ask = (tokenizer.apply_chat_template(turn, tokenize=True, add_generation_prompt=g) for g in (False, True))
    except Exception:  # NOTE: a template that needs other fields; no resume points then
        return ()
    bare, ask = (list(x["input_ids"] if isinstance(x, Mapping) else x) for x in (bare, ask))  # an encoding, or ids
    return tuple(ask[len(bare):]) if len(ask) > len(bare) and ask[:len(bare)] == bare else ()


def turn_ends(ids, marker: tuple[int, ...]) -> tuple[int, ...]:
    """Positions right after each occurrence of ``marker`` in ``ids`` (ints or an int array; vectorized)."""
    m = len(marker)
    if not m or len(ids) < m:
        return ()
    arr = ids if isinstance(ids, np.ndarray) else np.fromiter(ids, dtype=np.int64, count=len(ids))
    hit = np.ones(len(ids) - m + 1, dtype=bool)
    for j, t in enumerate(marker):
        hit &= arr[j:len(ids) - m + 1 + j] == t
    return tuple((np.flatnonzero(hit) + m).tolist())

