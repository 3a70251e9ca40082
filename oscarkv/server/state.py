"""Per-app server state: the served model, request validation, and generation with metrics.

Role: :class:`Server` is what ``app.state.server`` holds (one per app, no globals): the
:class:`~oscarkv.engine.async_engine.AsyncEngine`, the :class:`ServedModel` clients see, the
:class:`~oscarkv.config.ServerConfig` and the app's
:class:`~oscarkv.server.metrics.ServerMetrics`. :meth:`Server.prepare` turns a parsed body
(``oscarkv.server.protocol``) into a :class:`Prepared` request — model name, unsupported
options, prompt token ids, ``max_tokens`` against the context — or raises
:class:`~oscarkv.server.protocol.RequestError`; the endpoints (``oscarkv.server.endpoints``)
hand it to :meth:`Server.generate`, which wraps ``AsyncEngine.generate`` and records metrics.

A request the engine could never run (:meth:`~oscarkv.engine.engine.LLMEngine.check_request`)
is refused here, before any response starts. A full KV pool is the scheduler's business (it
queues new requests and preempts running ones by recompute); the server only refuses a request
that could not fit the pools even alone (:attr:`~oscarkv.engine.engine.LLMEngine.max_pool_tokens`), since the engine cannot run
one.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from oscarkv.engine.async_engine import AsyncEngine, RequestFailed
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import RequestOutput, SamplingParams
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


def served_model(engine: LLMEngine, hf_config, tokenizer, name: str, cfg: ServerConfig) -> ServedModel:
    """Resolve the context limit: ``cfg.max_model_len`` or the model's positions, never beyond the pools."""
    limit = min(engine.max_pool_tokens, getattr(hf_config, "max_position_embeddings", None) or 1 << 62)
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
