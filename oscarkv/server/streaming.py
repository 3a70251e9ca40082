"""Response plumbing shared by the endpoints: SSE lines, usage, and racing a client's disconnect.

Role: :func:`sse` formats one server-sent event (``data: <json>``) from a pydantic model or a
plain object; :func:`error_event` is the error body sent in place of a chunk once a stream's
status line has gone out. :func:`usage_of` counts the tokens of a :class:`Prepared` request
and its last :class:`~oscarkv.engine.request.RequestOutput`.

Cancellation: a streaming client that disconnects makes Starlette cancel the response task;
the cancellation reaches ``AsyncEngine.stream``, whose ``finally`` aborts the request, and the
engine frees its pages. A non-streaming request is raced against ``http.disconnect`` the same
way (:func:`until_disconnect`, over :func:`last_output` of the request's outputs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable

from fastapi import Request

from oscarkv.engine.request import RequestOutput
from oscarkv.server import protocol as P
from oscarkv.server.state import Prepared


def usage_of(prep: Prepared, out: RequestOutput | None) -> P.Usage:
    n = len(out.token_ids) if out is not None else 0
    return P.Usage(prompt_tokens=len(prep.prompt_ids), completion_tokens=n, total_tokens=len(prep.prompt_ids) + n)


def error_event(exc: Exception) -> str:
    if isinstance(exc, P.RequestError):
        return sse(exc.body)
    return sse(P.ErrorResponse(error=P.ErrorInfo(message=str(exc), type="internal_server_error")))


def sse(obj) -> str:
    body = obj.model_dump_json(exclude_none=True) if hasattr(obj, "model_dump_json") else json.dumps(obj)
    return f"data: {body}\n\n"


async def until_disconnect(request: Request, work: Awaitable):
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


async def last_output(outs: AsyncIterator[RequestOutput]) -> RequestOutput | None:
    last = None
    async for out in outs:
        last = out
    return last
