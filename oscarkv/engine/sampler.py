"""Token choice per sequence: greedy, temperature, top-k, top-p, per-request RNG.

Role: turns the runner's fp32 logits ``[N, V]`` (one row per sequence that samples this
step) into token ids and their log-probabilities. Greedy rows take the argmax (ties → the
lowest id, as ``torch.argmax``); other rows draw from the tempered, top-k/top-p filtered
distribution with the sequence's own ``torch.Generator`` — so a seeded request gives the same
tokens in any batch. Log-probabilities are those of the model's distribution (raw logits).

Tokens are chosen on the logits' device (:class:`DeviceTokens`; each request's generator lives
there): they stay on the device, where the engine's next step reads them as its inputs, while
their copy to the host completes in the background.
"""

from __future__ import annotations

import torch

from oscarkv.engine.request import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p on one row ``[V]`` (removed entries → -inf)."""
    x = (logits - logits.max()) / params.temperature  # shifted first: a tiny temperature must not overflow to inf
    if params.top_k and params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, idx = torch.sort(x, descending=True)
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop = cum - sorted_x.softmax(-1) >= params.top_p  # tokens after the mass reached top_p
        x = x.masked_fill(torch.zeros_like(drop).scatter(0, idx, drop), float("-inf"))
    return x


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> tuple[list[int], list[float]]:
    """Tokens and their log-probabilities for ``logits [N, V]`` fp32 (waits for the device)."""
    return DeviceTokens(logits, params, generators).result()


class DeviceTokens:
    """One step's tokens and their log-probabilities, chosen on the logits' device and copied to
    the host in the background (pinned memory and an event on CUDA); :meth:`result` waits for the
    copy. Greedy rows take the argmax; the others draw with their request's generator, which lives
    on the same device (``Sequence``), so nothing waits for the device here."""

    def __init__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> None:
        tokens = logits.argmax(-1)  # [N] int64 on the device: the next step's inputs
        for i, (p, gen) in enumerate(zip(params, generators)):
            if not p.greedy:
                probs = filter_logits(logits[i], p).softmax(-1)
                if gen is not None and gen.device != probs.device:  # a host generator: draw there (a sync)
                    probs = probs.cpu()
                tokens[i] = torch.multinomial(probs, 1, generator=gen)[0].to(tokens.device)
        self.tokens = tokens
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
        cuda = logits.device.type == "cuda"
        self._host = (torch.empty(tokens.shape, dtype=torch.int64, pin_memory=cuda),
                      torch.empty(logprobs.shape, dtype=torch.float32, pin_memory=cuda))
        self._host[0].copy_(tokens, non_blocking=cuda)
        self._host[1].copy_(logprobs, non_blocking=cuda)
        self._copied = torch.cuda.Event() if cuda else None
        if self._copied is not None:
            self._copied.record()

    def result(self) -> tuple[list[int], list[float]]:
        """Tokens and log-probabilities as host lists (waits for this step's copy only)."""
        if self._copied is not None:
            self._copied.synchronize()
        return self._host[0].tolist(), self._host[1].tolist()


def prompt_logprobs(logits: torch.Tensor, targets: list[int], k: int) -> list[dict[int, float]]:
    """Per row of ``logits [n, V]``: log-probs of ``targets[i]`` and of the ``k`` most likely tokens."""
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for i, t in enumerate(targets):
        row = {t: float(logp[i, t])}
        if k:
            vals, ids = logp[i].topk(k)
            row.update(zip(ids.tolist(), vals.tolist()))
        out.append(row)
    return out
