"""Turn a :class:`SchedulerOutput` into tensors, run the paged model, return logits.

Role: owns the model, the pool tensors, the per-layer storage codecs and the attention
backend. For each step it flattens the scheduled chunks into one token batch
(``ids, positions [T]``, ``cu_seqlens [B + 1]``), gathers the write plans into slots and
demotion lists and the prefix views into :class:`PageTables`, builds a
:class:`~oscarkv.engine.attention.StepContext` and runs the model once. It returns the logits
of the last token of every chunk that samples, and, for requests that asked for prompt
log-probabilities, the final hidden states of their prompt positions. The engine hands them to the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oscarkv.cache.kv_pools import KVPools
from oscarkv.cache.paged_layout import PageTables
from oscarkv.engine.attention import AttentionBackend, LayerStorage, StepContext
from oscarkv.engine.scheduler import ScheduledChunk
from oscarkv.models.llama import PagedLM


@dataclass
class RunnerOutput:
    sample_logits: torch.Tensor  # [n_sampling_chunks, V] fp32, in chunk order
    prompt_hidden: dict[int, torch.Tensor]  # chunk index -> [rows, D] final hidden states of prompt positions


def _table(rows: list[list[int]], device) -> torch.Tensor:
    width = max([1, *map(len, rows)])
    t = torch.zeros(len(rows), width, dtype=torch.int32)
    for b, pages in enumerate(rows):
        t[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
    return t.to(device)


def _ints(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


class ModelRunner:
    """The model and its KV storage for one device (see the module docstring)."""

    def __init__(self, model: PagedLM, pools: KVPools, storage: list[LayerStorage],
                 backend: AttentionBackend) -> None:
        self.model, self.pools, self.storage, self.backend = model, pools, storage, backend
        self.device = next(model.parameters()).device
        self.scale = model.head_dim ** -0.5

    def context(self, chunks: list[ScheduledChunk]) -> StepContext:
        """Slots, demotions and prefix views of a step as tensors."""
        plans, dev = [c.plan for c in chunks], self.device
        tables = PageTables(
            bf16_table=_table([p.view_bf16 for p in plans], dev),
            bf16_lens=_ints([p.view_bf16_len for p in plans], dev),
            int2_table=_table([p.view_int2 for p in plans], dev),
            int2_lens=_ints([len(p.view_int2) * self.pools.geo.page_size for p in plans], dev))
        cu = [0]
        for p in plans:
            cu.append(cu[-1] + p.t1 - p.t0)
        return StepContext(self.backend, self.pools, self.storage, tables, _ints(cu, dev),
                           _ints([s for p in plans for s in p.slots], dev),
                           _ints([s for p in plans for s in p.demote_src], dev),
                           _ints([s for p in plans for s in p.demote_dst], dev), self.scale)

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        ids = [t for c in chunks for t in c.seq.token_ids[c.plan.t0:c.plan.t1]]
        pos = [p for c in chunks for p in range(c.plan.t0, c.plan.t1)]
        step = self.context(chunks)
        hidden = self.model(torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device), step)
        cu = step.cu_seqlens.tolist()
        last = [cu[i + 1] - 1 for i, c in enumerate(chunks) if c.samples]
        prompt = {}
        for i, c in enumerate(chunks):
            n = min(c.plan.t1, c.seq.num_prompt - 1) - c.plan.t0  # rows whose next token is a prompt token
            if c.seq.params.prompt_logprobs is not None and n > 0:
                prompt[i] = hidden[cu[i]:cu[i] + n]  # logits formed blockwise by the engine
        return RunnerOutput(self.model.compute_logits(hidden[last]), prompt)
