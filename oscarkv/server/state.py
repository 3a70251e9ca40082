"""Per-app server state: the served model, request validation, and generation with metrics.

Role: :class:`Server` is what ``app.state.server`` holds (one per app, no globals): the
:class:`~oscarkv.engine.async_engine.AsyncEngine`, the :class:`ServedModel` clients see, the
:class:`~oscarkv.config.ServerConfig` and the app's
:class:`~oscarkv.server.metrics.ServerMetrics`. :meth:`Server.prepare` turns a parsed body
(``oscarkv.server.protocol``) into a :class:`Prepared` request — model name, unsupported
options, prompt token ids, ``max_tokens`` against the context — or raises
:class:`~oscarkv.server.protocol.RequestError`; the endpoints (``oscarkv.server.endpoints``)
hand it to :meth:`Server.generate`, which wraps ``AsyncEngine.stream`` and records metrics.

A request the engine could never run (:mod:`oscarkv.engine.admission`) is refused here, before any
response starts: :meth:`Server.prepare` validates it once, in a worker thread (``AsyncEngine.validate``),
and :meth:`Server.generate` streams the :class:`~oscarkv.engine.admission.ValidRequest`, which the
engine queues without checking it again. A full KV pool is the scheduler's business (it
queues new requests and preempts running ones by recompute); the server only refuses a request
that could not fit the pools even alone (:attr:`~oscarkv.engine.engine.LLMEngine.max_pool_tokens`), since the engine cannot run
one. A prompt whose character count alone proves it over the context is refused before it is
tokenized; text is tokenized and chat-templated in a worker thread, off the event loop.

Shutdown: :meth:`Server.drain` (called by ``oscarkv.server.launch`` on SIGTERM/SIGINT) refuses
new requests with a 503, waits for the requests in flight (``in_flight``) for the grace period,
then aborts the rest, which end with a 503 error (an error event in a stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from oscarkv.engine.admission import ValidRequest
from oscarkv.engine.async_engine import AsyncEngine, RequestFailed
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import RequestOutput, SamplingParams
from oscarkv.engine.token_memo import TokenMemo, whole_ids
from oscarkv.server import protocol as P
from oscarkv.config import ServerConfig
from oscarkv.server.metrics import ServerMetrics


@dataclass(frozen=True)
class ServedModel:
    """The model behind the engine as clients see it."""

    name: str
    tokenizer: object
    max_model_len: int
    vocab_size: int
    max_token_chars: int = 0
    """Most characters of text one token covers (:func:`longest_token_chars`); 0: unknown."""
    tokens: TokenMemo | None = None
    """The engine's :class:`~oscarkv.engine.token_memo.TokenMemo` (a chat's follow-up encodes only its new turns)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokens is not None and self.tokens.tokenizer is self.tokenizer:  # NOTE: not a tokenizer swapped in
            return self.tokens.encode(text, add_special_tokens)
        return whole_ids(self.tokenizer, text, add_special_tokens)


def served_model(engine: LLMEngine, hf_config, tokenizer, name: str, cfg: ServerConfig) -> ServedModel:
    """Resolve the context limit: ``cfg.max_model_len`` or the model's positions, never beyond the pools."""
    limit = min(engine.max_pool_tokens, getattr(hf_config, "max_position_embeddings", None) or 1 << 62)
    return ServedModel(name, tokenizer, min(cfg.max_model_len or limit, limit), hf_config.vocab_size,
                       longest_token_chars(tokenizer), engine.tokens)


def longest_token_chars(tokenizer) -> int:
    """An upper bound on the characters of text one token covers (0 when the vocabulary is unknown),
    so a prompt's length in characters alone can prove it over the context (no tokenizing).

    A vocabulary entry spells its text at least as long as the text: byte-level BPE writes each
    byte as one character, SentencePiece writes ``▁`` for a space. NOTE: a normalizer may compose
    characters (NFC makes ``e`` + U+0301 one ``é``), hence 4x slack when the tokenizer has one."""
    try:
        longest = max(map(len, tokenizer.get_vocab()))
    except (AttributeError, TypeError, ValueError):
        return 0
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return longest * (1 if backend is not None and backend.normalizer is None else 4)


@dataclass
class Prepared:
    """A request validated by the engine, ready to stream, and when it arrived."""

    request: ValidRequest
    arrival: float

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.request.prompt_ids

    @property
    def params(self) -> SamplingParams:
        return self.request.params


class Server:
    """Per-app state and the request logic the route functions call."""

    def __init__(self, engine: AsyncEngine, model: ServedModel, cfg: ServerConfig) -> None:
        self.engine, self.model, self.cfg = engine, model, cfg
        self.metrics = ServerMetrics(engine)
        self.in_flight: set[str] = set()
        self.draining = False  # new requests are refused (503)
        self.cut = False  # requests still running were aborted at the end of the grace period

    # ------------------------------------------------------------------------- validation
    async def prepare(self, req: P.SamplingRequest, prompt_ids: list[int], max_tokens: int | None,
                      default_max: int, prefix: str, logprobs: bool) -> Prepared:
        """Check the prompt and ``max_tokens`` against the served context, then have the engine validate the
        request (in a worker thread); ``default_max``: the endpoint's default ``max_tokens`` (``0``: the rest of
        the context). Raises :class:`~oscarkv.server.protocol.RequestError` (a 4xx) for a refused request."""
        arrival = time.perf_counter()
        if not prompt_ids:
            raise P.RequestError("the prompt is empty", param="prompt")
        room = self.model.max_model_len - len(prompt_ids)
        if max_tokens is None:
            max_tokens = min(self.cfg.default_max_tokens or default_max or room, room)
        if room < 1 or max_tokens > room:
            raise P.RequestError(f"This model's maximum context length is {self.model.max_model_len} tokens. "
                                 f"However, you requested {len(prompt_ids) + max(max_tokens, 1)} tokens "
                                 f"({len(prompt_ids)} in the prompt, {max(max_tokens, 1)} for the completion). "
                                 "Please reduce the prompt or max_tokens.", param="max_tokens" if room >= 1 else "prompt",
                                 code="context_length_exceeded")
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        try:
            params = req.sampling_params(max_tokens, logprobs)
            request = await self.engine.validate(request_id, prompt_ids, params)
        except ValueError as e:
            raise P.RequestError(str(e)) from e
        return Prepared(request, arrival)

    def check_model(self, req: P.SamplingRequest) -> None:
        if self.draining:
            raise P.RequestError("the server is shutting down; retry on another replica or later", 503,
                                 code="shutting_down", type="service_unavailable")
        if req.model != self.model.name:
            raise P.RequestError(f"The model `{req.model}` does not exist; this server serves `{self.model.name}`.",
                                 404, "model", "model_not_found", "NotFoundError")
        bad = req.unsupported()
        if bad is not None:
            raise P.RequestError(f"unsupported option {bad[0]}: {bad[1]}", param=bad[0], code="unsupported")

    def check_chars(self, chars: int) -> None:
        """Refuse a prompt whose length in characters alone proves it over the context."""
        most = self.model.max_model_len * self.model.max_token_chars
        if self.model.max_token_chars and chars > most:
            raise P.RequestError(f"This model's maximum context length is {self.model.max_model_len} tokens, and one "
                                 f"token covers at most {self.model.max_token_chars} characters; the prompt has "
                                 f"{chars} characters, more than {most}. Please reduce the prompt.",
                                 param="prompt", code="context_length_exceeded")

    async def completion_ids(self, req: P.CompletionRequest) -> list[int]:
        """The prompt's token ids; text is tokenized in a worker thread (the event loop serves on)."""
        prompt = req.single_prompt()
        if isinstance(prompt, str):
            self.check_chars(len(prompt))
            return await asyncio.to_thread(self.model.encode, prompt) if prompt else []
        if not all(0 <= t < self.model.vocab_size for t in prompt):
            raise P.RequestError(f"prompt token ids must lie in [0, {self.model.vocab_size})", param="prompt")
        return list(prompt)

    async def chat_ids(self, req: P.ChatCompletionRequest) -> list[int]:
        """The messages through the chat template, then tokenized, in a worker thread."""
        if not getattr(self.model.tokenizer, "chat_template", None):
            raise P.RequestError("this model's tokenizer has no chat template; use /v1/completions", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        self.check_chars(sum(len(m["content"]) for m in messages))  # NOTE: templates add text, never drop it
        return await asyncio.to_thread(self._chat_ids, messages)

    def _chat_ids(self, messages: list[dict]) -> list[int]:
        tok = self.model.tokenizer
        try:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # a template may raise on message orders it does not accept (jinja2 errors)
            raise P.RequestError(f"the chat template rejected the messages: {e}", param="messages") from e
        return self.model.encode(text, add_special_tokens=False)

    # ------------------------------------------------------------------------- generation
    async def generate(self, prep: Prepared, endpoint: str) -> AsyncIterator[RequestOutput]:
        """``AsyncEngine.stream`` plus metrics; leaving early aborts (pages freed)."""
        if self.cut:  # it was still being tokenized when the grace period ended
            raise self._shut_down()
        self.metrics.admit(len(prep.prompt_ids))
        ttft, last, reason = None, None, "abort"
        self.in_flight.add(prep.request_id)
        try:
            async with contextlib.aclosing(self.engine.stream(prep.request)) as outs:
                async for out in outs:
                    if ttft is None and out.new_token_ids:
                        ttft = time.perf_counter() - prep.arrival
                    last, reason = out, out.finish_reason or reason
                    if out.finish_reason == "abort" and self.cut:
                        raise self._shut_down()
                    yield out
        except RequestFailed:
            reason = "error"
            raise
        except ValueError as e:  # refused by the engine when added (its id in use)
            raise P.RequestError(str(e)) from e
        finally:
            self.in_flight.discard(prep.request_id)
            n = len(last.token_ids) if last is not None else 0
            self.metrics.observe_request(endpoint, reason, n, ttft, time.perf_counter() - prep.arrival)

    def _shut_down(self) -> P.RequestError:
        return P.RequestError(f"the server shut down before this request finished (it ran past the "
                              f"{self.cfg.shutdown_grace:g} s grace period)", 503, code="shutting_down",
                              type="service_unavailable")

    async def drain(self, grace: float) -> tuple[int, int]:
        """Graceful shutdown: refuse new requests, let those in flight run for up to ``grace``
        seconds, then abort the rest (each ends with a 503 error; the engine frees its pages).
        Returns ``(finished, cut)``: how many ended within the grace period and how many were cut."""
        self.draining = True
        loop, started = asyncio.get_running_loop(), set(self.in_flight)
        end = loop.time() + grace
        while self.in_flight and loop.time() < end:
            await asyncio.sleep(0.02)
        cut = set(self.in_flight)
        self.cut = True
        for request_id in cut:
            await self.engine.abort(request_id)
        while self.in_flight and loop.time() < end + 5:  # each stream sends its error event and leaves
            await asyncio.sleep(0.02)
        return len(started - cut), len(cut)

    def token_text(self, token_id: int) -> str:
        return self.model.tokenizer.decode([token_id])
