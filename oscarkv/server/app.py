"""The FastAPI app: OpenAI-compatible endpoints over one :class:`AsyncEngine` (no globals).

Role: :func:`create_app` builds an app bound to an engine, a :class:`ServedModel` and a
:class:`~oscarkv.config.ServerConfig`; everything a handler needs hangs off
``app.state.server`` (:class:`~oscarkv.server.state.Server`). Endpoints:

* ``POST /v1/completions`` and ``POST /v1/chat/completions`` (the tokenizer's chat template),
  each as one JSON body or as SSE chunks (``stream=true``; ``stream_options.include_usage``
  adds a usage chunk), ending with ``data: [DONE]``;
* ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format).

Request path: body → pydantic (``oscarkv.server.protocol``) → :meth:`Server.prepare`
(``oscarkv.server.state``: model name, unsupported options, prompt token ids, ``max_tokens``
against the context; the engine's one validation, ``AsyncEngine.validate``, in a worker thread) →
``AsyncEngine.stream`` → JSON or SSE (``oscarkv.server.endpoints``,
``oscarkv.server.streaming``: a client's disconnect aborts its request). Every refusal is an
OpenAI error body with a 4xx status and every failure a 500, from the handlers of
``oscarkv.server.errors``; the server keeps serving. Middleware (``oscarkv.server.middleware``)
counts every response by path and status, checks the API key of ``/v1/*`` and answers 413 to an
oversized body before it is parsed.

The names the rest of the package and the tests use (:func:`served_model`, :class:`Server`,
...) are importable from here as well as from their modules.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.server import protocol as P
from oscarkv.config import ServerConfig
from oscarkv.server.endpoints import COMPLETIONS_DEFAULT_MAX_TOKENS, chat_completions, completions
from oscarkv.server.errors import error_response, install_handlers
from oscarkv.server.middleware import ApiKey, BodyLimit, StatusCounter
from oscarkv.server.state import Prepared, ServedModel, Server, served_model

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "ERRORS", "Prepared", "ServedModel", "Server", "chat_completions",
           "completions", "create_app", "served_model"]

ERRORS = {code: {"model": P.ErrorResponse} for code in (400, 401, 404, 413, 500, 503)}


def create_app(engine: AsyncEngine, model: ServedModel, cfg: ServerConfig) -> FastAPI:
    """An app serving ``model`` through ``engine`` (the caller owns the engine and closes it)."""
    app = FastAPI(title="oscarkv", version="0.1.0", description="OpenAI-compatible API over the INT2 KV-cache engine")
    server = app.state.server = Server(engine, model, cfg)
    install_handlers(app)
    app.add_middleware(BodyLimit, limit=cfg.max_request_bytes)  # the one added last runs first
    if cfg.api_key:
        app.add_middleware(ApiKey, key=cfg.api_key, protect_metrics=cfg.protect_metrics)
    app.add_middleware(StatusCounter, metrics=server.metrics)

    @app.post("/v1/completions", response_model=P.CompletionResponse, responses=ERRORS)
    async def post_completions(req: P.CompletionRequest, request: Request) -> Response:
        return await completions(server, req, request)

    @app.post("/v1/chat/completions", response_model=P.ChatCompletionResponse, responses=ERRORS)
    async def post_chat(req: P.ChatCompletionRequest, request: Request) -> Response:
        return await chat_completions(server, req, request)

    @app.get("/v1/models", response_model=P.ModelList)
    async def get_models() -> P.ModelList:
        kv = engine.config.kv.method
        return P.ModelList(data=[P.ModelCard(id=model.name, max_model_len=model.max_model_len, kv=kv)])

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_alive():
            return error_response(503, "the engine thread has stopped", kind="internal_server_error")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
