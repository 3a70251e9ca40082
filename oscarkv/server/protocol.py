"""The OpenAI wire format: request and response models of the endpoints ``oscarkv serve`` offers.

Role: pydantic models parse and range-check request bodies (FastAPI turns a failure into a
400 with an OpenAI error body, see ``oscarkv.server.errors``); :meth:`SamplingRequest.sampling_params`
maps the accepted fields onto :class:`~oscarkv.engine.request.SamplingParams`. Fields that the
engine cannot honour (``n > 1``, penalties, ``logit_bias``, tools, ...) are accepted by the
schema and refused by :meth:`SamplingRequest.unsupported` with the offending ``param`` named,
so a client learns what to drop instead of silently getting something else. Unknown fields
are refused too (``extra="forbid"``).

Responses are built with plain models (``model_dump(exclude_none=True)``) so that the official
``openai`` client parses them; streaming chunks are the same objects sent as SSE ``data:`` lines.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from oscarkv.server.router_fields import drop_neutral
from pydantic_core import PydanticCustomError

from oscarkv.engine.request import SamplingParams

SEED_MAX = 2**63 - 1
"""Largest seed accepted (``torch.Generator.manual_seed`` takes 64-bit values)."""
GREEDY_EPS = 1e-5
"""Temperatures below this sample greedily (as vLLM does): dividing logits by a tiny
temperature overflows fp32 to inf, and the softmax to NaN."""

TOP_P_MIN = 1e-6
"""Smaller ``top_p`` values are raised to this: the nucleus is the top token either way, and a
subnormal ``top_p`` rounds to 0 in fp32, where the sampler would drop every token."""

MAX_STOP = 4
"""Most stop strings a request may give (OpenAI's limit)."""

Float = Annotated[float, Field(allow_inf_nan=False)]


def valid_unicode(s: str) -> str:
    """``s`` if it encodes as UTF-8; a lone surrogate (a JSON ``\\ud800`` escape without its
    pair: valid JSON, invalid Unicode, which tokenizers cannot take) raises naming its place."""
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"invalid Unicode: lone surrogate U+{ord(s[e.start]):04X} at character {e.start} "
                         "(a \\uD800-\\uDFFF escape without its pair)") from None
    return s


Text = Annotated[str, AfterValidator(valid_unicode)]
"""A request string: any Unicode text that encodes as UTF-8."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------------------ errors
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo


class RequestError(Exception):
    """A request the server refuses; becomes an :class:`ErrorResponse` with ``status``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.body = status, ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=code))


# ------------------------------------------------------------------------------ requests
class StreamOptions(_Strict):
    include_usage: bool = False
    """Send a last chunk with token usage (and ``usage: null`` in the others)."""


class SamplingRequest(_Strict):
    """Fields shared by ``/v1/completions`` and ``/v1/chat/completions``."""

    model: Text
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[Float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = None
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    presence_penalty: Annotated[Float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[Float, Field(ge=-2, le=2)] = 0.0
    logit_bias: dict[str, Float] | None = None
    user: Text | None = None
    ignore_eos: bool = False
    """Extension (vLLM): keep generating past the end-of-sequence token."""

    _router_fields = model_validator(mode="before")(drop_neutral)  # what vllm-router adds (server.router_fields)

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are supported, got {len(stop)}")
        return stop

    def unsupported(self) -> tuple[str, str] | None:
        """``(param, why)`` for the first accepted-but-unsupported option that is set."""
        checks = [("n", self.n != 1, "only n=1 is supported"),
                  ("presence_penalty", self.presence_penalty != 0, "penalties are not supported"),
                  ("frequency_penalty", self.frequency_penalty != 0, "penalties are not supported"),
                  ("logit_bias", bool(self.logit_bias), "logit_bias is not supported"),
                  ("stream_options", self.stream_options is not None and not self.stream,
                   "stream_options needs stream=true")]
        return next(((p, why) for p, bad, why in checks if bad), None)

    def sampling_params(self, max_tokens: int, logprobs: bool) -> SamplingParams:
        temperature = 1.0 if self.temperature is None else self.temperature
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(max_tokens=max_tokens, temperature=0.0 if temperature < GREEDY_EPS else temperature,
                              top_k=self.top_k or 0, top_p=1.0 if self.top_p is None else max(self.top_p, TOP_P_MIN),
                              seed=self.seed, stop=tuple(s for s in stop if s), ignore_eos=self.ignore_eos,
                              logprobs=logprobs)


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: one prompt as text or token ids."""

    prompt: Text | Annotated[list[int], Field(min_length=1)] | Annotated[list[Text], Field(min_length=1)] \
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    best_of: Annotated[int, Field(ge=1)] | None = None
    suffix: Text | None = None

    def unsupported(self) -> tuple[str, str] | None:
        checks = [("prompt", isinstance(self.prompt, list) and isinstance(self.prompt[0], (str, list))
                   and len(self.prompt) > 1, "one prompt per request is supported"),
                  ("logprobs", bool(self.logprobs), "only logprobs=0 (the chosen token) is supported"),
                  ("echo", self.echo, "echo is not supported"),
                  ("best_of", (self.best_of or 1) != 1, "only best_of=1 is supported"),
                  ("suffix", bool(self.suffix), "suffix is not supported")]
        return next(((p, why) for p, bad, why in checks if bad), None) or super().unsupported()

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        return p[0] if isinstance(p, list) and isinstance(p[0], (str, list)) else p


TEXT_ONLY = "text_only"
"""The error type of a content part that is not text; the app's handler names the served model in it."""
TEXT_ONLY_MESSAGE = "{what} not supported: {model} is served text only here (content part type {kind}); send text parts only"


class TextPart(_Strict):
    type: Literal["text"]
    text: Text

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, part: Any) -> Any:
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind != "text":
            what = "images are" if "image" in kind else "audio is" if "audio" in kind else "files are" \
                if "file" in kind else f"content parts of type {kind!r} are"
            raise PydanticCustomError(TEXT_ONLY, TEXT_ONLY_MESSAGE, {"what": what, "model": "the model",
                                                                     "kind": repr(kind)})
        return part


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None

    def text(self) -> str:
        c = self.content
        return c if isinstance(c, str) else "".join(p.text for p in c or [])


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Text | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

    def unsupported(self) -> tuple[str, str] | None:
        checks = [("top_logprobs", bool(self.top_logprobs), "only top_logprobs=0 is supported"),
                  ("tools", bool(self.tools), "tools are not supported"),
                  ("tool_choice", self.tool_choice not in (None, "none"), "tools are not supported"),
                  ("response_format", self.response_format is not None and self.response_format.type != "text",
                   "only response_format type 'text' is supported")]
        return next(((p, why) for p, bad, why in checks if bad), None) or super().unsupported()

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ------------------------------------------------------------------------------ responses
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "oscarkv"
    max_model_len: int
    kv: str
    """Extension: the KV storage method (``EngineConfig.kv.method``)."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
