"""A request inside the engine: its tokens, cache pages, sampling state and text.

Role: owned by the :class:`~oscarkv.engine.scheduler.Scheduler` from admission to finish.
``token_ids`` is the prompt followed by the generated tokens (``prompt_ids`` keeps the prompt
once more as an immutable tuple, shared by every :class:`RequestOutput`, so building an output
costs O(generated tokens), not O(prompt): at 100K prompt tokens the per-step copy of the prompt
took 0.33-0.46 ms of a 6.3 ms decode step on an H100); ``kv.num_tokens`` of them are
stored in the cache (the cache manager advances it). A step computes the chunk
``[num_computed, schedule.end(num_computed))``; when that chunk reaches the last known token
the step samples a new one. After a preemption ``num_computed`` is 0 again and the chunks
replay exactly as they ran (prompt chunks, then one generated token per step, without
sampling), so the resumed request continues with the same cache bytes and the same RNG state.

While the engine runs a step ahead (``LLMEngine.step``, overlap), the token being sampled on the
device sits in ``token_ids`` as :data:`PENDING` from the moment the next step is planned until
the current one is finished; ``step()`` never returns with a ``PENDING`` in place.
"""

from __future__ import annotations

import itertools
from enum import Enum

import torch

from oscarkv.cache.seq_kv import ChunkSchedule, SeqKV
from oscarkv.engine.detokenizer import IncrementalText
from oscarkv.engine.request import RequestOutput, SamplingParams

_arrivals = itertools.count()

PENDING = -1
"""A token id not yet on the host: the device holds it (see the module docstring)."""


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request's engine state (see the module docstring)."""

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                 schedule: ChunkSchedule, default_seed: int, device: torch.device | str = "cpu",
                 detok: IncrementalText | None = None) -> None:
        if not prompt_ids:
            raise ValueError(f"request {request_id}: empty prompt")
        self.request_id, self.params, self.schedule = request_id, params, schedule
        self.arrival = next(_arrivals)
        self.prompt_ids: tuple[int, ...] = tuple(prompt_ids)
        self.token_ids: list[int] = list(self.prompt_ids)
        self.num_prompt = len(self.prompt_ids)
        self.kv = SeqKV()
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.logprobs: list[float] = []
        self.prompt_logprobs: list[dict[int, float] | None] = [None]
        seed = params.seed if params.seed is not None else default_seed + self.arrival
        # NOTE: on the model's device, so that sampling never waits for it (``sampler.DeviceTokens``)
        self.generator = None if params.greedy else torch.Generator(device=device).manual_seed(seed)
        self.detok = detok  # the output text (None without a tokenizer: token ids only)
        self.sent_text_len, self.sent_tokens = 0, 0

    @property
    def text(self) -> str:
        return self.detok.text if self.detok is not None else ""

    @property
    def num_computed(self) -> int:
        return self.kv.num_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt:]

    def next_chunk(self) -> tuple[int, int]:
        t0 = self.num_computed
        return t0, self.schedule.end(t0)

    def output(self) -> RequestOutput:
        """Cumulative output and the delta since the last call (while unfinished, the text is held
        back by ``IncrementalText.holdback``, so a partial stop string or UTF-8 sequence never leaks)."""
        finished, text = self.status is Status.FINISHED, self.text
        held = 0 if finished or self.detok is None else self.detok.holdback
        end = max(self.sent_text_len, len(text) - held)
        generated = self.output_ids
        out = RequestOutput(
            self.request_id, self.prompt_ids, generated, text[:end],
            new_token_ids=generated[self.sent_tokens:], new_text=text[self.sent_text_len:end],
            logprobs=list(self.logprobs) if self.params.logprobs else None,
            prompt_logprobs=list(self.prompt_logprobs) if self.params.prompt_logprobs is not None else None,
            finished=finished, finish_reason=self.finish_reason, error=self.error)
        self.sent_text_len, self.sent_tokens = end, len(generated)
        return out
