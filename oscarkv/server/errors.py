"""OpenAI error bodies for every refusal and failure, as the app's exception handlers.

Role: :func:`install_handlers` makes each exception a handler answers with an OpenAI error body
(``{"error": {message, type, param, code}}``) and a status, so the server keeps serving:

* :class:`~oscarkv.server.protocol.RequestError` (raised by validation) — its own body, 4xx;
* ``RequestValidationError`` (malformed JSON, schema violations) — 400, ``param`` the field; a content
  part that is not text is refused naming the served model as text only;
* Starlette's ``HTTPException`` (unknown path, wrong method) — its status;
* :class:`~oscarkv.engine.async_engine.RequestFailed` (the engine step of this request
  failed; the engine thread fails only the requests of that step) — 500;
* any other exception — 500.

These answer only before a response starts; a stream that fails later carries an error event
instead (``oscarkv.server.streaming.error_event``).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from oscarkv.engine.async_engine import RequestFailed
from oscarkv.server import protocol as P


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   kind: str = "invalid_request_error") -> JSONResponse:
    body = P.ErrorResponse(error=P.ErrorInfo(message=message, type=kind, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


def _union_tag(part: str) -> bool:
    """Pydantic names the member of a union in an error's location (``stop.str``,
    ``prompt.list[int]``, ``content.function-after[...]``); the client's ``param`` is the field."""
    return "[" in part or "-" in part or part in ("str", "int", "float", "bool", "list", "dict")


def _most_telling(errors: list[dict]) -> dict:
    """The error that tells the client most. A union field fails once per member (a list of ten
    stop strings is also "not a valid string"): a validator's own message (the limit, the
    unsupported feature, the invalid Unicode) beats a constraint, which beats a type mismatch;
    then the deepest location."""
    def rank(err: dict) -> tuple:
        kind = err.get("type", "")
        return (kind == "json_invalid", kind in ("value_error", P.TEXT_ONLY), not kind.endswith("_type"),
                len(err.get("loc", ())))
    return max(errors, key=rank) if errors else {"loc": (), "msg": "invalid request"}


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    err = _most_telling(list(exc.errors()))
    loc = [str(x) for x in err.get("loc", ()) if x != "body" and not _union_tag(str(x))]
    if err.get("type") == "json_invalid":
        return error_response(400, f"malformed JSON body: {err.get('ctx', {}).get('error', err['msg'])}",
                              code="json_invalid")
    where, msg = ".".join(loc), err["msg"].removeprefix("Value error, ")
    server = getattr(request.app.state, "server", None)
    if err.get("type") == P.TEXT_ONLY and server is not None:  # name the served model
        msg = P.TEXT_ONLY_MESSAGE.format(**{**err["ctx"], "model": repr(server.model.name)})
    return error_response(400, f"{where + ': ' if where else ''}{msg}", where or None, err.get("type"))


async def _request_error(_: Request, exc: P.RequestError) -> JSONResponse:
    return JSONResponse(exc.body.model_dump(), status_code=exc.status)


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail),
                          kind="NotFoundError" if exc.status_code == 404 else "invalid_request_error")


async def _request_failed(_: Request, exc: RequestFailed) -> JSONResponse:
    return error_response(500, f"the engine failed on this request: {exc}", kind="internal_server_error")


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}", kind="internal_server_error")


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(P.RequestError, _request_error)
    app.add_exception_handler(RequestFailed, _request_failed)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
