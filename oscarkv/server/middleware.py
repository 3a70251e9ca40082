"""ASGI middleware of the app: response counting, the request body limit and the API key.

Role: ``oscarkv.server.app`` wraps its routes in these, outermost first:

* :class:`StatusCounter` counts every response by path and status in ``/metrics``
  (``oscarkv_http_responses``), a 500 answered for an exception that escaped the app included;
* :class:`ApiKey` answers 401 with an OpenAI error body to a ``/v1/*`` request (and to
  ``/metrics`` when asked) without ``Authorization: Bearer <key>``; ``/health`` stays open;
* :class:`BodyLimit` answers 413 to a body over ``ServerConfig.max_request_bytes``: at once from
  its ``Content-Length``, or as soon as a chunked body passes the limit, before any parsing.
"""

from __future__ import annotations

import hmac

from starlette.exceptions import HTTPException

from oscarkv.server.errors import error_response
from oscarkv.server.metrics import ServerMetrics

PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
"""Paths counted under their own name in ``oscarkv_http_responses`` (the rest as ``other``)."""


class StatusCounter:
    """Counts responses by path and status (``oscarkv_http_responses``)."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in PATHS else "other"
        started = False

        async def counting_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.http.labels(path, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:  # answered 500 by Starlette's outermost handler (oscarkv.server.errors)
            if not started:
                self.metrics.http.labels(path, "500").inc()
            raise


class ApiKey:
    """Bearer-token check of ``/v1/*`` (and ``/metrics`` when ``protect_metrics``)."""

    def __init__(self, app, key: str, protect_metrics: bool) -> None:
        self.app, self.key, self.protect_metrics = app, key.encode(), protect_metrics

    def guarded(self, path: str) -> bool:
        return path.startswith("/v1/") or (self.protect_metrics and path == "/metrics")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.guarded(scope["path"]):
            return await self.app(scope, receive, send)
        auth = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return await self.app(scope, receive, send)
        message = ("Incorrect API key provided." if auth else
                   "Missing API key: send it as the header 'Authorization: Bearer KEY'.")
        response = error_response(401, message, code="invalid_api_key")
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


class BodyLimit:
    """413 for a request body over ``limit`` bytes, before it is parsed."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    def message(self, size: str) -> str:
        return (f"the request body ({size}) exceeds the server's limit of {self.limit} bytes "
                "(ServerConfig.max_request_bytes)")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            response = error_response(413, self.message(f"{int(length)} bytes"), code="request_too_large")
            return await response(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # a chunked body: the route's body read answers 413 (errors._http_error)
                    raise HTTPException(413, self.message(f"more than {self.limit} bytes"))
            return message

        await self.app(scope, limited_receive, send)
