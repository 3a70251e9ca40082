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
        if not chunk_ends and not resume and self.turn_marker:
            resume = turn_ends(ids, self.turn_marker)
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

