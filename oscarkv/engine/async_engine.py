"""An asyncio driver for servers: submit a request, async-iterate its outputs, cancel it.

Role: runs :meth:`LLMEngine.step` in one background thread (the model is blocking); the
event loop talks to it through a thread-safe command queue (add, abort) and receives each
request's :class:`RequestOutput` s on its own ``asyncio.Queue``. The engine is touched only
by the worker thread, so the scheduler needs no locks.

    engine = AsyncEngine(LLMEngine.from_hf(...))
    async for out in engine.generate("id-1", prompt, SamplingParams(max_tokens=64)):
        print(out.new_text, end="")
    await engine.abort("id-1")   # or break out of the loop: the request is aborted

A server validates first and streams the validated request (:meth:`AsyncEngine.validate` runs
``LLMEngine.validate`` in a worker thread, off the event loop and off the engine's thread, so a refusal
comes before any response starts; :meth:`AsyncEngine.stream` then trusts it); :meth:`AsyncEngine.generate`
does both. The server reads the engine only through this class's methods (``stats``, ``config``,
``is_alive``), never through ``AsyncEngine.engine``.

Failures: a request the engine refuses raises its ``ValueError`` (from ``validate``, or from the stream
of ``generate`` before any output); a request
whose engine step failed (``finish_reason == "error"``) raises :class:`RequestFailed`. The
thread survives both and keeps serving; should ``step()`` itself raise (an engine bug), every
request in flight fails with :class:`RequestFailed` and the loop goes on. ``close()`` stops
the thread and the engine's worker processes (tensor parallelism).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator

from oscarkv.config import EngineConfig
from oscarkv.engine.admission import ValidRequest
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import RequestOutput, SamplingParams
from oscarkv.engine.stats import EngineStats

log = logging.getLogger(__name__)


class RequestFailed(RuntimeError):
    """The engine failed while running this request (not the client's fault)."""


class AsyncEngine:
    """Background-thread engine loop with per-request async streams."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="oscarkv-engine", daemon=True)
        self._thread.start()

    async def validate(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> ValidRequest:
        """``LLMEngine.validate`` in a worker thread (tokenizing a text prompt included): the request to
        :meth:`stream`, or its ``ValueError``."""
        return await asyncio.to_thread(self.engine.validate, request_id, prompt, params)

    async def stream(self, request: ValidRequest) -> AsyncIterator[RequestOutput]:
        """Submit a validated request and stream its outputs; leaving the loop early aborts it."""
        q: asyncio.Queue = asyncio.Queue()
        rid = request.request_id
        self._streams[rid] = (asyncio.get_running_loop(), q)
        self._commands.put(("add", request))
        finished = False
        try:
            while not finished:
                item = await q.get()
                if isinstance(item, Exception):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._commands.put(("abort", rid))
            self._streams.pop(rid, None)

    async def generate(self, request_id: str, prompt: str | list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """:meth:`validate`, then :meth:`stream`; leaving the loop early aborts the request."""
        request = await self.validate(request_id, prompt, params)
        async with contextlib.aclosing(self.stream(request)) as outs:
            async for out in outs:
                yield out

    async def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def is_alive(self) -> bool:
        """Whether the worker thread runs (it stops only on ``close()``) and the engine can run steps (with
        tensor parallelism every rank lives: ``LLMEngine.failure``)."""
        return self._thread.is_alive() and self.engine.failure() is None

    @property
    def config(self) -> EngineConfig:
        """The engine's configuration (frozen)."""
        return self.engine.cfg

    def stats(self) -> EngineStats:
        """``LLMEngine.stats()``: pool pages, queue, counters (safe from the event loop's thread: it reads
        counters and pool sizes, and a scrape may see them one step apart)."""
        return self.engine.stats()

    def close(self) -> None:
        """Stop the thread, then the engine (its tensor-parallel workers, if any)."""
        self._stop.set()
        self._commands.put(("wake",))
        self._thread.join()
        self.engine.close()

    # ------------------------------------------------------------------------- worker thread
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not self.engine.has_unfinished())
            if self.engine.has_unfinished():
                self._step()

    def _step(self) -> None:
        try:
            outs = self.engine.step()
        except Exception as e:  # the engine's state is in doubt: fail everything in flight
            log.exception("engine step raised; failing every request in flight")
            for rid in list(self.engine.seqs):
                with contextlib.suppress(Exception):  # abort pops the request first: it leaves either way
                    self.engine.abort(rid)
                self._emit(rid, RequestFailed(f"engine step failed: {type(e).__name__}: {e}"))
            return
        for out in outs:
            self._emit(out.request_id, RequestFailed(out.error) if out.finish_reason == "error" else out)

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.1) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            request: ValidRequest = cmd[1]
            try:
                self.engine.add(request)
            except ValueError as e:  # its id is in use
                self._emit(request.request_id, e)
            except Exception as e:  # an engine bug: this request fails, the thread lives
                log.exception("adding request %s failed", request.request_id)
                self._emit(request.request_id, RequestFailed(f"{type(e).__name__}: {e}"))
        elif cmd[0] == "abort":
            out = self.engine.abort(cmd[1])
            if out is not None:
                self._emit(cmd[1], out)

    def _emit(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            loop, q = stream
            loop.call_soon_threadsafe(q.put_nowait, item)
