"""The two generation endpoints: ``/v1/completions`` and ``/v1/chat/completions``.

Role: :func:`completions` and :func:`chat_completions` are what the routes of
``oscarkv.server.app`` call. Each validates through :class:`~oscarkv.server.state.Server`
(model name, options, prompt token ids — the chat one through the tokenizer's chat template —
and ``max_tokens``; text is tokenized and a whole body's log-probabilities detokenized in a worker
thread, so the event loop stays free for health checks and other streams), then either awaits the last output (raced against the client's disconnect;
a client gone gets a 499) and returns one JSON body, or streams SSE chunks
(``stream=true``; ``stream_options.include_usage`` adds a usage chunk) ending with
``data: [DONE]``. An engine failure after the status line has gone out becomes an error event
before ``[DONE]``; before that, the app's exception handlers (``oscarkv.server.errors``) answer.
Token log-probabilities are converted here into each endpoint's wire shape.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from oscarkv.engine.async_engine import RequestFailed
from oscarkv.engine.request import RequestOutput
from oscarkv.server import protocol as P
from oscarkv.server.state import Prepared, Server
from oscarkv.server.streaming import error_event, last_output, sse, until_disconnect, usage_of

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's documented default of ``max_tokens`` for ``/v1/completions``."""


# ----------------------------------------------------------------------------- completions
def _completion_logprobs(server: Server, out: RequestOutput, offset: int = 0) -> P.CompletionLogprobs | None:
    if out.logprobs is None:
        return None
    tokens = [server.token_text(t) for t in out.new_token_ids]
    lps = out.logprobs[len(out.logprobs) - len(tokens):]
    offsets = list(itertools.accumulate(map(len, tokens), initial=offset))[:-1]
    return P.CompletionLogprobs(tokens=tokens, token_logprobs=lps, text_offset=offsets)


async def completions(server: Server, req: P.CompletionRequest, request: Request) -> Response:
    server.check_model(req)
    prep = await server.prepare(req, await server.completion_ids(req), req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS,
                          "cmpl", logprobs=req.logprobs is not None)
    if req.stream:
        return StreamingResponse(_completion_stream(server, req, prep), media_type="text/event-stream")
    out = await until_disconnect(request, last_output(server.generate(prep, "completions")))
    if out is None:
        return Response(status_code=499)
    return JSONResponse(await asyncio.to_thread(_completion_body, server, prep, out))  # detokenizing logprobs


def _completion_body(server: Server, prep: Prepared, out: RequestOutput) -> dict:
    lp = None
    if out.logprobs is not None:
        out.new_token_ids = out.token_ids
        lp = _completion_logprobs(server, out)
    choice = P.CompletionChoice(text=out.text, logprobs=lp, finish_reason=out.finish_reason)
    body = P.CompletionResponse(id=prep.request_id, model=server.model.name, choices=[choice],
                                usage=usage_of(prep, out))
    return body.model_dump(exclude_none=True)


async def _completion_stream(server: Server, req: P.CompletionRequest, prep: Prepared) -> AsyncIterator[str]:
    usage = req.stream_options is not None and req.stream_options.include_usage
    last, sent = None, 0
    try:
        async for out in server.generate(prep, "completions"):
            last = out
            choice = P.CompletionChoice(text=out.new_text, logprobs=_completion_logprobs(server, out, sent),
                                        finish_reason=out.finish_reason)
            sent += len(out.new_text)
            yield sse(P.CompletionResponse(id=prep.request_id, model=server.model.name, choices=[choice]))
    except (P.RequestError, RequestFailed) as e:  # the status line is sent: the error goes in the stream
        yield error_event(e)
    if usage:
        yield sse(P.CompletionResponse(id=prep.request_id, model=server.model.name, choices=[],
                                       usage=usage_of(prep, last)))
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
    prep = await server.prepare(req, await server.chat_ids(req), req.requested_max_tokens, 0, "chatcmpl",
                          logprobs=req.logprobs)
    if req.stream:
        return StreamingResponse(_chat_stream(server, req, prep), media_type="text/event-stream")
    out = await until_disconnect(request, last_output(server.generate(prep, "chat")))
    if out is None:
        return Response(status_code=499)
    return JSONResponse(await asyncio.to_thread(_chat_body, server, prep, out))


def _chat_body(server: Server, prep: Prepared, out: RequestOutput) -> dict:
    if out.logprobs is not None:
        out.new_token_ids = out.token_ids
    choice = P.ChatChoice(message=P.AssistantMessage(content=out.text), logprobs=_chat_logprobs(server, out),
                          finish_reason=out.finish_reason)
    body = P.ChatCompletionResponse(id=prep.request_id, model=server.model.name, choices=[choice],
                                    usage=usage_of(prep, out))
    return body.model_dump(exclude_none=True)


async def _chat_stream(server: Server, req: P.ChatCompletionRequest, prep: Prepared) -> AsyncIterator[str]:
    usage = req.stream_options is not None and req.stream_options.include_usage

    def chunk(delta: P.Delta, out: RequestOutput | None = None) -> str:
        choice = P.ChatChunkChoice(delta=delta, finish_reason=out.finish_reason if out else None,
                                   logprobs=_chat_logprobs(server, out) if out else None)
        return sse(P.ChatCompletionChunk(id=prep.request_id, model=server.model.name, choices=[choice]))

    yield chunk(P.Delta(role="assistant", content=""))
    last = None
    try:
        async for out in server.generate(prep, "chat"):
            last = out
            if out.new_text or out.finished or out.logprobs is not None:  # held-back text (a stop prefix, partial UTF-8): nothing to send
                yield chunk(P.Delta(content=out.new_text) if out.new_text else P.Delta(), out)
    except (P.RequestError, RequestFailed) as e:
        yield error_event(e)
    if usage:
        yield sse(P.ChatCompletionChunk(id=prep.request_id, model=server.model.name, choices=[],
                                        usage=usage_of(prep, last)))
    yield "data: [DONE]\n\n"
