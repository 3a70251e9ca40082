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

from oscarkv.cache.paged_layout import device_tensor
from oscarkv.engine.request import SamplingParams


def filter_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, then top-p, row ``i`` of ``logits [n, V]`` by ``params[i]`` (removed
    entries → -inf). One sort for all rows, and only if a row asks for top-k or top-p."""
    dev, V = logits.device, logits.shape[-1]
    temp = device_tensor([p.temperature for p in params], dev, torch.float32)[:, None]
    x = (logits - logits.amax(-1, keepdim=True)) / temp  # shifted first: a tiny temperature must not overflow to inf
    if all((not p.top_k or p.top_k >= V) and p.top_p >= 1.0 for p in params):
        return x
    ks = [p.top_k if p.top_k and p.top_k < V else V for p in params]
    top_p = device_tensor([p.top_p if p.top_p < 1.0 else float("inf") for p in params], dev, torch.float32)[:, None]
    sorted_x, idx = torch.sort(x, dim=-1, descending=True)
    kth = sorted_x.gather(1, device_tensor([k - 1 for k in ks], dev, torch.int64)[:, None])
    sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))  # top-k (ties with the k-th stay)
    probs = sorted_x.softmax(-1)
    drop = (probs.cumsum(-1) - probs >= top_p) | (sorted_x == float("-inf"))  # after the mass reached top_p
    return x.masked_fill(torch.zeros_like(drop).scatter(1, idx, drop), float("-inf"))


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
        drawn = [i for i, p in enumerate(params) if not p.greedy]
        if drawn:
            # NOTE: rows picked by a device index: indexing a CUDA tensor with a host list waits for the device
            rows = device_tensor(drawn, logits.device, torch.int64)
            probs = filter_logits(logits.index_select(0, rows), [params[i] for i in drawn]).softmax(-1)  # [n, V]
            # a draw from p is argmax(p / E) with E ~ Exp(1) i.i.d. (the exponential race; torch.multinomial
            # does the same per call): one noise row per request from its own generator — the same tokens
            # in any batch — and one division and argmax for all rows
            noise = torch.empty_like(probs)
            for row, i in zip(noise, drawn):
                gen = generators[i]
                if gen is not None and gen.device.type != row.device.type:  # a host generator: draw there (a sync)
                    row.copy_(torch.empty(row.shape).exponential_(generator=gen))
                else:
                    row.exponential_(generator=gen)
            tokens[rows] = (probs / noise.clamp_(min=torch.finfo(noise.dtype).tiny)).argmax(-1)
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
