"""What a client asks for and gets back: :class:`SamplingParams` and :class:`RequestOutput`.

Role: the engine's public data types (the offline ``LLM``, the async driver and the HTTP
server share them). ``SamplingParams`` are validated on construction; ``RequestOutput`` is
emitted by ``LLMEngine.step`` for each request that produced tokens, with the cumulative
result and the delta since the previous output (for streaming).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops (vLLM's field names)."""

    max_tokens: int = 16
    """Generated tokens at most (finish reason ``length``)."""
    temperature: float = 1.0
    """Softmax temperature; ``0`` is greedy (argmax)."""
    top_k: int = 0
    """Keep the ``k`` most likely tokens; ``0`` keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches ``top_p``."""
    seed: int | None = None
    """Per-request seed: the same seed gives the same tokens, whatever the batch."""
    stop: tuple[str, ...] = ()
    """Stop strings; the output text ends before the first one (finish reason ``stop``)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the request (kept in ``token_ids``)."""
    ignore_eos: bool = False
    """Keep generating past the tokenizer's end-of-sequence token."""
    logprobs: bool = False
    """Return the log-probability of each chosen token under the model's distribution
    (before temperature, top-k and top-p)."""
    prompt_logprobs: int | None = None
    """Per prompt position, the log-probabilities of the prompt token and of the
    ``prompt_logprobs`` most likely tokens (``0``: the prompt token only)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must lie in (0, 1], got {self.top_p}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"SamplingParams.prompt_logprobs must be >= 0, got {self.prompt_logprobs}")
        object.__setattr__(self, "stop", tuple([self.stop] if isinstance(self.stop, str) else self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RequestOutput:
    """State of one request after a step: cumulative output plus this step's delta."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    """The prompt, one tuple shared by every output of the request (never copied per step)."""
    token_ids: list[int]
    text: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    logprobs: list[float] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    error: str | None = None  # why a request finished with "error" (the engine step raised)
