"""The FastAPI app: OpenAI-compatible endpoints over one :class:`AsyncEngine` (no globals).

Role: :func:`create_app` builds an app bound to an engine, a :class:`ServedModel` and a
:class:`~oscarkv.server.config.ServerConfig`; everything a handler needs hangs off
``app.state.server`` (:class:`Server`). Endpoints:

* ``POST /v1/completions`` and ``POST /v1/chat/completions`` (the tokenizer's chat template),
  each as one JSON body or as SSE chunks (``stream=true``; ``stream_options.include_usage``
  adds a usage chunk), ending with ``data: [DONE]``;
* ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format).

Request path: body → pydantic (``oscarkv.server.protocol``) → :meth:`Server.prepare` (model
name, unsupported options, prompt token ids, ``max_tokens`` against the context) →
``AsyncEngine.generate`` → JSON or SSE. Every refusal is an OpenAI error body with a 4xx status
(:class:`~oscarkv.server.protocol.RequestError`; malformed JSON and schema violations go
through the same handler) and the server keeps serving. A request the engine could never run
(:meth:`~oscarkv.engine.engine.LLMEngine.check_request`) is refused the same way, before any
response starts. A request whose engine step fails gets a 500 error body (or, once streaming,
an error event before ``[DONE]``); the engine thread fails only the requests of that step.

Cancellation: a streaming client that disconnects makes Starlette cancel the response task;
the cancellation reaches ``AsyncEngine.generate``, whose ``finally`` aborts the request, and the
engine frees its pages. A non-streaming request is raced against ``http.disconnect`` the same
way (:func:`_until_disconnect`). A full KV pool is the scheduler's business (it queues new
requests and preempts running ones by recompute); the server only refuses a request that could
not fit the pools even alone (:func:`pool_token_limit`), since the engine cannot run one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from oscarkv.engine.async_engine import AsyncEngine, RequestFailed
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import RequestOutput, SamplingParams
from oscarkv.server import protocol as P
from oscarkv.server.config import ServerConfig
from oscarkv.server.metrics import ServerMetrics

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's documented default of ``max_tokens`` for ``/v1/completions``."""
ERRORS = {code: {"model": P.ErrorResponse} for code in (400, 404, 500)}


@dataclass(frozen=True)
class ServedModel:
    """The model behind the engine as clients see it."""

    name: str
    tokenizer: object
    max_model_len: int
    vocab_size: int


def pool_token_limit(engine: LLMEngine) -> int:
    """Longest sequence the KV pools hold on their own: BF16 pages for ``kv=bf16``; else INT2
    history pages plus the BF16 sink and recent window (the BF16 pool is sized for windows)."""
    cap, kv = engine.runner.pools.geo.capacity(), engine.cfg.kv
    if not engine.manager.quantized:
        return cap["bf16_tokens"]
    return min(cap["int2_tokens"] + kv.sink + kv.recent, cap["bf16_tokens"] + cap["int2_tokens"])


def served_model(engine: LLMEngine, hf_config, tokenizer, name: str, cfg: ServerConfig) -> ServedModel:
    """Resolve the context limit: ``cfg.max_model_len`` or the model's positions, never beyond the pools."""
    limit = min(pool_token_limit(engine), getattr(hf_config, "max_position_embeddings", None) or 1 << 62)
    return ServedModel(name, tokenizer, min(cfg.max_model_len or limit, limit), hf_config.vocab_size)


@dataclass
class Prepared:
    """A validated request, ready for the engine."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float


class Server:
    """Per-app state and the request logic the route functions call."""

    def __init__(self, engine: AsyncEngine, model: ServedModel, cfg: ServerConfig) -> None:
        self.engine, self.model, self.cfg = engine, model, cfg
        self.metrics = ServerMetrics(engine.engine)

    # ------------------------------------------------------------------------- validation
    def prepare(self, req: P.SamplingRequest, prompt_ids: list[int], max_tokens: int | None,
                default_max: int, prefix: str, logprobs: bool) -> Prepared:
        """Check the prompt and ``max_tokens`` against the context and build the engine request;
        ``default_max``: the endpoint's default ``max_tokens`` (``0``: the rest of the context)."""
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
            self.engine.engine.check_request(request_id, prompt_ids, params)
        except ValueError as e:
            raise P.RequestError(str(e)) from e
        return Prepared(request_id, prompt_ids, params, arrival)

    def check_model(self, req: P.SamplingRequest) -> None:
        if req.model != self.model.name:
            raise P.RequestError(f"The model `{req.model}` does not exist; this server serves `{self.model.name}`.",
                                 404, "model", "model_not_found", "NotFoundError")
        bad = req.unsupported()
        if bad is not None:
            raise P.RequestError(f"unsupported option {bad[0]}: {bad[1]}", param=bad[0], code="unsupported")

    def completion_ids(self, req: P.CompletionRequest) -> list[int]:
        prompt = req.single_prompt()
        if isinstance(prompt, str):
            return self.model.tokenizer(prompt).input_ids if prompt else []
        if not all(0 <= t < self.model.vocab_size for t in prompt):
            raise P.RequestError(f"prompt token ids must lie in [0, {self.model.vocab_size})", param="prompt")
        return list(prompt)

    def chat_ids(self, req: P.ChatCompletionRequest) -> list[int]:
        tok = self.model.tokenizer
        if not getattr(tok, "chat_template", None):
            raise P.RequestError("this model's tokenizer has no chat template; use /v1/completions", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # a template may raise on message orders it does not accept (jinja2 errors)
            raise P.RequestError(f"the chat template rejected the messages: {e}", param="messages") from e
        return tok(text, add_special_tokens=False).input_ids

    # ------------------------------------------------------------------------- generation
    async def generate(self, prep: Prepared, endpoint: str) -> AsyncIterator[RequestOutput]:
        """``AsyncEngine.generate`` plus metrics; leaving early aborts (pages freed)."""
        self.metrics.admit(len(prep.prompt_ids))
        ttft, last, reason = None, None, "abort"
        try:
            async with contextlib.aclosing(self.engine.generate(prep.request_id, prep.prompt_ids, prep.params)) as outs:
                async for out in outs:
                    if ttft is None and out.new_token_ids:
                        ttft = time.perf_counter() - prep.arrival
                    last, reason = out, out.finish_reason or reason
                    yield out
        except RequestFailed:
            reason = "error"
            raise
        except ValueError as e:  # refused by the engine when added (check_request let it pass)
            raise P.RequestError(str(e)) from e
        finally:
            n = len(last.token_ids) if last is not None else 0
            self.metrics.observe_request(endpoint, reason, n, ttft, time.perf_counter() - prep.arrival)

    def token_text(self, token_id: int) -> str:
        return self.model.tokenizer.decode([token_id])


def _usage(prep: Prepared, out: RequestOutput | None) -> P.Usage:
    n = len(out.token_ids) if out is not None else 0
    return P.Usage(prompt_tokens=len(prep.prompt_ids), completion_tokens=n, total_tokens=len(prep.prompt_ids) + n)


def _error_event(exc: Exception) -> str:
    if isinstance(exc, P.RequestError):
        return _sse(exc.body)
    return _sse(P.ErrorResponse(error=P.ErrorInfo(message=str(exc), type="internal_server_error")))


def _sse(obj) -> str:
    body = obj.model_dump_json(exclude_none=True) if hasattr(obj, "model_dump_json") else json.dumps(obj)
    return f"data: {body}\n\n"


async def _until_disconnect(request: Request, work: Awaitable):
    """Await ``work``; if the client disconnects first, cancel it (aborting its request) and
    return ``None``."""
    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _last(outs: AsyncIterator[RequestOutput]) -> RequestOutput | None:
    last = None
    async for out in outs:
        last = out
    return last


# ----------------------------------------------------------------------------- completions
def _completion_logprobs(server: Server, out: RequestOutput, offset: int = 0) -> P.CompletionLogprobs | None:
    if out.logprobs is None:
        return None
    tokens = [server.token_text(t) for t in out.new_token_ids]
    lps = out.logprobs[len(out.logprobs) - len(tokens):]
    offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return P.CompletionLogprobs(tokens=tokens, token_logprobs=lps, text_offset=offsets)


async def completions(server: Server, req: P.CompletionRequest, request: Request) -> Response:
    server.check_model(req)
    prep = server.prepare(req, server.completion_ids(req), req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, "cmpl",
                          logprobs=req.logprobs is not None)
    if req.stream:
        return StreamingResponse(_completion_stream(server, req, prep), media_type="text/event-stream")
    out = await _until_disconnect(request, _last(server.generate(prep, "completions")))
    if out is None:
        return Response(status_code=499)
    lp = None
    if out.logprobs is not None:
        out.new_token_ids = out.token_ids
        lp = _completion_logprobs(server, out)
    choice = P.CompletionChoice(text=out.text, logprobs=lp, finish_reason=out.finish_reason)
    body = P.CompletionResponse(id=prep.request_id, model=server.model.name, choices=[choice], usage=_usage(prep, out))
    return JSONResponse(body.model_dump(exclude_none=True))


async def _completion_stream(server: Server, req: P.CompletionRequest, prep: Prepared) -> AsyncIterator[str]:
    usage = req.stream_options is not None and req.stream_options.include_usage
    last, sent = None, 0
    try:
        async for out in server.generate(prep, "completions"):
            last = out
            choice = P.CompletionChoice(text=out.new_text, logprobs=_completion_logprobs(server, out, sent),
                                        finish_reason=out.finish_reason)
            sent += len(out.new_text)
            yield _sse(P.CompletionResponse(id=prep.request_id, model=server.model.name, choices=[choice]))
    except (P.RequestError, RequestFailed) as e:  # the status line is sent: the error goes in the stream
        yield _error_event(e)
    if usage:
        yield _sse(P.CompletionResponse(id=prep.request_id, model=server.model.name, choices=[],
                                        usage=_usage(prep, last)))
    yield "data: [DONE]\n\n"


# ----------------------------------------------------------------------------- chat
def _chat_logprobs(server: Server, out: RequestOutput) -> P.ChoiceLogprobs | None:
    if out.logprobs is None:
        return None
    ids = out.new_token_ids
    lps = out.logprobs[len(out.logprobs) - len(ids):]
    content = []
    for t, lp in zip(ids, lps):
        text = server.token_text(t)
        content.append(P.TokenLogprob(token=text, logprob=lp, bytes=list(text.encode())))
    return P.ChoiceLogprobs(content=content)


async def chat_completions(server: Server, req: P.ChatCompletionRequest, request: Request) -> Response:
    server.check_model(req)
    prep = server.prepare(req, server.chat_ids(req), req.requested_max_tokens, 0, "chatcmpl",
                          logprobs=req.logprobs)
    if req.stream:
        return StreamingResponse(_chat_stream(server, req, prep), media_type="text/event-stream")
    out = await _until_disconnect(request, _last(server.generate(prep, "chat")))
    if out is None:
        return Response(status_code=499)
    if out.logprobs is not None:
        out.new_token_ids = out.token_ids
    choice = P.ChatChoice(message=P.AssistantMessage(content=out.text), logprobs=_chat_logprobs(server, out),
                          finish_reason=out.finish_reason)
    body = P.ChatCompletionResponse(id=prep.request_id, model=server.model.name, choices=[choice],
                                    usage=_usage(prep, out))
    return JSONResponse(body.model_dump(exclude_none=True))


async def _chat_stream(server: Server, req: P.ChatCompletionRequest, prep: Prepared) -> AsyncIterator[str]:
    usage = req.stream_options is not None and req.stream_options.include_usage

    def chunk(delta: P.Delta, out: RequestOutput | None = None) -> str:
        choice = P.ChatChunkChoice(delta=delta, finish_reason=out.finish_reason if out else None,
                                   logprobs=_chat_logprobs(server, out) if out else None)
        return _sse(P.ChatCompletionChunk(id=prep.request_id, model=server.model.name, choices=[choice]))

    yield chunk(P.Delta(role="assistant", content=""))
    last = None
    try:
        async for out in server.generate(prep, "chat"):
            last = out
            if out.new_text or out.finished or out.logprobs is not None:  # held-back text (a stop prefix, partial UTF-8): nothing to send
                yield chunk(P.Delta(content=out.new_text) if out.new_text else P.Delta(), out)
    except (P.RequestError, RequestFailed) as e:
        yield _error_event(e)
    if usage:
        yield _sse(P.ChatCompletionChunk(id=prep.request_id, model=server.model.name, choices=[],
                                         usage=_usage(prep, last)))
    yield "data: [DONE]\n\n"


# ----------------------------------------------------------------------------- the app
def _error(status: int, message: str, param: str | None = None, code: str | None = None,
           kind: str = "invalid_request_error") -> JSONResponse:
    body = P.ErrorResponse(error=P.ErrorInfo(message=message, type=kind, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


def _union_tag(part: str) -> bool:
    """Pydantic names the member of a union in an error's location (``stop.str``,
    ``prompt.list[int]``, ``content.function-after[...]``); the client's ``param`` is the field."""
    return "[" in part or "-" in part or part in ("str", "int", "float", "bool", "list", "dict")


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(x) for x in err.get("loc", ()) if x != "body" and not _union_tag(str(x))]
    if err.get("type") == "json_invalid":
        return _error(400, f"malformed JSON body: {err.get('ctx', {}).get('error', err['msg'])}", code="json_invalid")
    where = ".".join(loc)
    return _error(400, f"{where + ': ' if where else ''}{err['msg']}", where or None, err.get("type"))


async def _request_error(_: Request, exc: P.RequestError) -> JSONResponse:
    return JSONResponse(exc.body.model_dump(), status_code=exc.status)


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return _error(exc.status_code, str(exc.detail), kind="NotFoundError" if exc.status_code == 404 else "invalid_request_error")


async def _request_failed(_: Request, exc: RequestFailed) -> JSONResponse:
    return _error(500, f"the engine failed on this request: {exc}", kind="internal_server_error")


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    return _error(500, f"internal error: {type(exc).__name__}: {exc}", kind="internal_server_error")


def _install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(P.RequestError, _request_error)
    app.add_exception_handler(RequestFailed, _request_failed)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)


class _StatusCounter:
    """ASGI middleware counting responses by path and status (``oscarkv_http_responses``)."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                path = scope["path"] if scope["path"] in _PATHS else "other"
                self.metrics.http.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


def create_app(engine: AsyncEngine, model: ServedModel, cfg: ServerConfig) -> FastAPI:
    """An app serving ``model`` through ``engine`` (the caller owns the engine and closes it)."""
    app = FastAPI(title="oscarkv", version="0.1.0", description="OpenAI-compatible API over the INT2 KV-cache engine")
    server = app.state.server = Server(engine, model, cfg)
    _install_handlers(app)
    app.add_middleware(_StatusCounter, metrics=server.metrics)

    @app.post("/v1/completions", response_model=P.CompletionResponse, responses=ERRORS)
    async def post_completions(req: P.CompletionRequest, request: Request) -> Response:
        return await completions(server, req, request)

    @app.post("/v1/chat/completions", response_model=P.ChatCompletionResponse, responses=ERRORS)
    async def post_chat(req: P.ChatCompletionRequest, request: Request) -> Response:
        return await chat_completions(server, req, request)

    @app.get("/v1/models", response_model=P.ModelList)
    async def get_models() -> P.ModelList:
        kv = engine.engine.cfg.kv.method
        return P.ModelList(data=[P.ModelCard(id=model.name, max_model_len=model.max_model_len, kv=kv)])

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_alive():
            return _error(503, "the engine thread has stopped", kind="internal_server_error")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
