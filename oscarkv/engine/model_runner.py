"""Turn a :class:`SchedulerOutput` into tensors, run the paged model, return logits.

Role: owns the model, the pool tensors, the per-layer storage codecs and the attention
backend. For each step it flattens the scheduled chunks into one token batch
(``ids, positions [T]``, ``cu_seqlens [B + 1]``), gathers the write plans into slots and
demotion lists and the prefix views into :class:`PageTables`, builds a
:class:`~oscarkv.attention.step.StepContext` and runs the model once. It returns the logits
of the last token of every chunk that samples, and, for requests that asked for prompt
log-probabilities, the final hidden states of their prompt positions. The engine hands them to the sampler.

Decode steps: when the backend has ``decode_steps`` and every chunk of the step is one token
long, the step is built as a decode step (``StepContext.decode``; the BF16 view extended by
the token written this step, :meth:`ModelRunner.decode_view`) and, given graph buckets, runs
as a CUDA graph replay (:mod:`oscarkv.engine.cuda_graphs`) of the forward and the logits, fed
from host lists (:meth:`ModelRunner.decode_inputs`) with no per-step tensor building and no
host sync. A one-token step over a long cached prefix (a follow-up of one new token) is such a step.

Short extend steps of one sequence (2 to 64 tokens by default: a follow-up's first step, a speculative
verify chunk) replay an extend graph of their token bucket (:mod:`oscarkv.engine.extend_graphs`) where
the eager route of the shape is the split-K chunk kernel. Everything else — and every step of a backend
without ``decode_steps`` (the CPU oracles) — runs eagerly through ``extend``.

A step planned ahead (``LLMEngine.step``, overlap) has input tokens that are still on the device
(:data:`~oscarkv.engine.sequence.PENDING` on the host): :class:`PendingIds` writes them into the
step's token ids on the device, after the host lists are staged and before the forward.

Tensor parallelism (``oscarkv.engine.workers``): a runner holds one rank's shard and pools.
:meth:`ModelRunner.forward` needs only the step's write plans, so the ranks after 0 run it from the
plans rank 0 sends, and receive its token ids by a device broadcast; only rank 0 forms logits.
:func:`oscarkv.engine.runner_build.build_runner` folds a (sharded or whole) model's value codecs, sizes its pools
and builds the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from oscarkv.cache.kv_pools import KVPools
from oscarkv.cache.paged_layout import PageTables, device_tensor
from oscarkv.cache.manager import WritePlan
from oscarkv.attention.backends import TritonAttention
from oscarkv.attention.step import AttentionBackend, LayerStorage, StepContext, WindowStep
from oscarkv.engine.cuda_graphs import DecodeGraphs, DecodeInputs, DemoteGraphs
from oscarkv.engine.extend_graphs import ExtendGraphs
from oscarkv.engine.piecewise import PiecewiseGraphs
from oscarkv.engine.scheduler import ScheduledChunk
from oscarkv.models.llama import PagedLM
from oscarkv.models.parallel import TensorParallel
from oscarkv.quant.bpe import SlidingLayers


@dataclass
class RunnerOutput:
    sample_logits: torch.Tensor  # [n_sampling_chunks, V] fp32, in chunk order (decode graphs: valid until the next step)
    prompt_hidden: dict[int, torch.Tensor]  # chunk index -> [rows, D] final hidden states of prompt positions
    greedy: torch.Tensor | None = None  # [2, rows]: speculative.greedy_pair of sample_logits, where a graph formed it


@dataclass
class PendingIds:
    """Input tokens still on the device: chunk ``i`` of a decode step reads ``tokens[rows[i]]`` (the
    previous step's samples, :class:`~oscarkv.engine.sampler.DeviceTokens`)."""

    tokens: torch.Tensor  # [N] int64, device
    rows: list[int]  # [B] a row of tokens per chunk

    def write(self, ids: torch.Tensor) -> None:
        """Overwrite ``ids[:B]`` (device, one id per chunk) with the pending tokens (asynchronous)."""
        b = len(self.rows)
        if self.rows == list(range(b)):  # the usual step: the same sequences in the same order
            ids[:b].copy_(self.tokens[:b])
        else:
            ids[:b].copy_(self.tokens[device_tensor(self.rows, self.tokens.device)])


def _table(rows: list[list[int]], device) -> torch.Tensor:
    width = max([1, *map(len, rows)])
    # NOTE: one host tensor from padded lists (a per-row torch.tensor costs ~10 µs per row and step)
    return device_tensor([r + [0] * (width - len(r)) for r in rows], device)


class ModelRunner:
    """The model and its KV storage for one device (see the module docstring); with tensor
    parallelism, one rank's shard (``tp``: only rank 0 forms logits, ``oscarkv.engine.workers``).
    A :class:`~oscarkv.engine.runner.Runner`."""

    def __init__(self, model: PagedLM, pools: KVPools, storage: list[LayerStorage],
                 backend: AttentionBackend, graph_buckets: tuple[int, ...] = (),
                 tp: TensorParallel | None = None) -> None:
        self.model, self.pools, self.storage, self.backend = model, pools, storage, backend
        self.sliding = SlidingLayers.from_config(model.config)
        self.tp = tp or TensorParallel()
        self.device = next(model.parameters()).device
        self.scale = model.attention_scale
        self.graphs = DecodeGraphs(self, graph_buckets) if graph_buckets and self.device.type == "cuda" else None
        self.extend_graphs: ExtendGraphs | None = None  # set by build_runner (EngineConfig.extend_graph_buckets)
        self.piecewise: PiecewiseGraphs | None = None  # set by build_runner (EngineConfig.piecewise_graph_buckets)
        self.demote_graphs = (DemoteGraphs(self) if self.graphs is not None and isinstance(backend, TritonAttention)
                              and DemoteGraphs.wanted(pools) else None)

    def is_decode(self, plans: list[WritePlan]) -> bool:
        """Whether the step goes to ``decode``: one token per sequence and a backend that wants it."""
        return self.backend.decode_steps and all(p.t1 - p.t0 == 1 for p in plans)

    def decode_view(self, plan: WritePlan) -> tuple[list[int], int]:
        """The BF16 view at the new length: the prefix view plus the token written this step.

        NOTE: the new token's slot follows the view's last token in table order (sink and the
        recent window start on page boundaries), so it is appended without reordering."""
        page, off = divmod(plan.slots[0], self.pools.geo.page_size)
        assert off == plan.view_bf16_len % self.pools.geo.page_size and (off == 0 or plan.view_bf16[-1] == page)
        return (plan.view_bf16 + [page] if off == 0 else plan.view_bf16), plan.view_bf16_len + 1

    def decode_inputs(self, plans: list[WritePlan], ids: list[int]) -> DecodeInputs:
        """A decode step as host lists for the CUDA graphs (views include the new token)."""
        P = self.pools.geo.page_size
        views = [self.decode_view(p) for p in plans]
        return DecodeInputs(ids, [p.t0 for p in plans],
                            [p.slots[0] for p in plans], [v[0] for v in views], [v[1] for v in views],
                            [p.view_int2 for p in plans], [len(p.view_int2) * P for p in plans],
                            [s for p in plans for s in p.demote_src], [s for p in plans for s in p.demote_dst])

    def context(self, plans: list[WritePlan], cu: list[int], decode: bool = False) -> StepContext:
        """Slots and prefix views of a step as tensors (decode: views include the new token); the step's
        demotions are the caller's (:meth:`demote_all`)."""
        dev = self.device
        views = [self.decode_view(p) if decode else (p.view_bf16, p.view_bf16_len) for p in plans]
        bf16_lens = tuple(v[1] for v in views)
        int2_lens = tuple(len(p.view_int2) * self.pools.geo.page_size for p in plans)
        tables = PageTables(
            bf16_table=_table([v[0] for v in views], dev),
            bf16_lens=device_tensor(list(bf16_lens), dev),
            int2_table=_table([p.view_int2 for p in plans], dev),
            int2_lens=device_tensor(list(int2_lens), dev), host_lens=(bf16_lens, int2_lens))
        return StepContext(self.backend, self.pools, self.storage, tables, device_tensor(cu, dev),
                           device_tensor([s for p in plans for s in p.slots], dev), self.scale, decode,
                           cu_host=tuple(cu), window=self._window(plans))

    def _window(self, plans: list[WritePlan]) -> WindowStep | None:
        """The sliding layers' view of a step (``None`` for a model without sliding layers)."""
        if self.sliding is None:
            return None
        dev, wins = self.device, [p.window for p in plans]
        lens = tuple(w.view_len for w in wins)
        tables = PageTables(_table([w.view for w in wins], dev), device_tensor(list(lens), dev),
                            _table([[] for _ in wins], dev), device_tensor([0] * len(wins), dev),
                            host_lens=(lens, (0,) * len(wins)))
        return WindowStep(tables, device_tensor([s for w in wins for s in w.slots], dev), self.sliding.window)

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk], pending: PendingIds | None = None) -> RunnerOutput:
        """Run one step; ``pending``: its input tokens are on the device (a one-token chunk each)."""
        plans = [c.plan for c in chunks]
        ids = [t for c in chunks for t in c.seq.token_ids[c.plan.t0:c.plan.t1]]
        cu = _cu(plans)
        assert pending is None or cu[-1] == len(pending.rows) == len(chunks), "pending ids: one token per chunk"
        sample = [i for i, c in enumerate(chunks) if c.samples]
        hidden, logits = self.forward(plans, ids, pending)
        pair = self.extend_graphs.take_greedy() if self.extend_graphs is not None else None
        # the last row of a chunk, every row of a verify chunk (speculative: its drafts are in token_ids)
        rows = [r for i in sample for r in (range(cu[i], cu[i + 1]) if chunks[i].drafts else (cu[i + 1] - 1,))]
        if logits is None:
            logits, pair = self.model.compute_logits(hidden.index_select(0, device_tensor(rows, self.device))), None
        elif rows and rows == list(range(rows[0], rows[-1] + 1)):
            # NOTE: views of a graph's outputs (a row per token), valid until its next replay; the engine samples a
            # step (or launches its device sampling) before it launches the next one
            logits = logits[rows[0]:rows[-1] + 1]
            pair = None if pair is None else pair[:, rows[0]:rows[-1] + 1]
        else:  # NOTE: a host-list index would sync
            logits, pair = logits.index_select(0, device_tensor(rows, self.device)), None
        return RunnerOutput(logits, self._prompt_hidden(chunks, hidden, cu), pair)

    @torch.inference_mode()
    def forward(self, plans: list[WritePlan], ids: list[int] | None,
                pending: PendingIds | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model over one step: ``hidden [T, D]`` and, from a decode graph of rank 0, its ``logits [B, V]``
        (else ``None``). ``ids`` (flat, ``PENDING`` where ``pending`` holds them) is ``None`` on the ranks
        after 0: they receive rank 0's ids on the device (:meth:`_fill_ids`)."""
        cu = _cu(plans)
        ids = ids if ids is not None else [0] * cu[-1]
        fill, decode = self._fill_ids(pending), self.is_decode(plans)
        if decode and self.graphs is not None and self.graphs.bucket(len(plans)) is not None:
            return self.graphs.run(self.decode_inputs(plans, ids), fill)
        if not decode and self.extend_graphs is not None:
            why = self.extend_graphs.reason(plans)
            if why is None:
                return self.extend_graphs.run(plans[0], ids, fill)
            self.extend_graphs.fallbacks[why] += 1
        if not decode and self.piecewise is not None:
            why = self.piecewise.reason(plans)
            if why is None:
                context = self.context(plans, cu) if len(plans) > 1 else None  # several sequences: their tables
                return self.piecewise.run(plans, ids, _demotions(plans, self.pools.geo.page_size), fill, context), None
            self.piecewise.fallbacks[why] += 1
        pos = [p for plan in plans for p in range(plan.t0, plan.t1)]
        ids_t, pos_t = (device_tensor(v, self.device, torch.int64) for v in (ids, pos))
        if fill is not None:
            fill(ids_t)
        old, own = _demotions(plans, self.pools.geo.page_size)
        self.demote_all(*old)  # pages of the prefix: INT2 before any layer reads the view
        hidden = self.model(ids_t, pos_t, self.context(plans, cu, decode))
        self.demote_all(*own)  # pages this step wrote: once every layer has written them
        return hidden, None

    def demote_all(self, src: list[int], dst: list[int]) -> None:
        """Encode BF16 pages ``src`` into INT2 pages ``dst`` in every layer: two launches per clip rank rather
        than two per layer (an eager 512-token prefill step spent ~0.5 ms of host time per layer on demotion,
        H100, 2026-11-27, ``lab/scripts/prefill_host_profile.py``); the graphs call it before their replays."""
        if src and self.demote_graphs is not None:  # launches per layer and head range: graph replays
            self.demote_graphs.run(src, dst)
        elif src:
            s, d = (device_tensor(p, self.device) for p in (src, dst))
            self.backend.demote_all(self.pools, self.storage, s, d)

    def capture_graphs(self, rows: int) -> int:
        """Capture now every graph a step of up to ``rows`` decode rows or one sequence's chunk of up to ``rows``
        tokens replays — the routes of a verify step of ``rows - 1`` drafts (one chunk, or ``rows`` decode rows,
        ``oscarkv.engine.speculative``) and of the shorter ones ``draft_end`` makes near a demotion — so that no
        capture (nor the Triton compiles of its warm-up) lands in a later step; the number of graphs captured."""
        before, ext = self.num_graphs(), self.extend_graphs
        ext = ext if ext is not None and ext.serves else None  # NOTE: a layout split-K does not read runs eagerly
        for n in range(1, rows + 1):
            if self.graphs is not None and self.graphs.bucket(n) is not None:
                self.graphs.capture(n)
            if ext is not None and n >= 2 and ext.bucket(n) is not None:
                ext.capture(n)
        for n in self.demote_graphs.buckets if self.demote_graphs is not None else ():
            if n <= rows:  # a decode step demotes at most a page per row (not counted: graphs of the forward)
                self.demote_graphs.capture(n)
        return self.num_graphs() - before

    def num_graphs(self) -> int:
        """Decode and extend graphs captured so far (a step that raises it captured one)."""
        return sum(len(g.graphs) for g in (self.graphs, self.extend_graphs) if g is not None)

    def _fill_ids(self, pending: PendingIds | None) -> Callable[[torch.Tensor], None] | None:
        """What completes a step's device ids once the host's are staged: the pending tokens (overlap), then,
        with tensor parallelism, rank 0's ids broadcast to every rank (on the device: pending ones never
        visit the host); ``None``: nothing to do."""
        if pending is None and self.tp.size == 1:
            return None

        def fill(ids: torch.Tensor) -> None:
            if pending is not None:
                pending.write(ids)
            self.tp.broadcast(ids)
        return fill

    def close(self) -> None:
        """Nothing to release here (the pools go with the object; ``workers.ParallelRunner`` stops processes)."""

    def failure(self) -> str | None:
        """Why no more steps can run (``workers.ParallelRunner``: a rank died); ``None`` here."""
        return None

    def replay(self, bucket: int) -> None:
        """Replay the decode graph of ``bucket`` (captured by earlier steps; a benchmark's timing)."""
        self.graphs.graphs[bucket].graph.replay()

    def profile(self, bucket: int, reps: int = 5) -> list[dict]:
        """The per-kernel GPU time of ``reps`` replays of the graph of ``bucket``."""
        from oscarkv.engine.rank_profile import kernel_profile

        return kernel_profile(lambda: self.replay(bucket), reps)

    @staticmethod
    def _prompt_hidden(chunks: list[ScheduledChunk], hidden: torch.Tensor, cu: list[int]) -> dict[int, torch.Tensor]:
        out = {}
        for i, c in enumerate(chunks):
            n = min(c.plan.t1, c.seq.num_prompt - 1) - c.plan.t0  # rows whose next token is a prompt token
            if c.seq.params.prompt_logprobs is not None and n > 0:
                out[i] = hidden[cu[i]:cu[i] + n].clone()  # logits formed blockwise by the engine
        return out


def _demotions(plans: list[WritePlan], page_size: int) -> tuple[tuple[list[int], list[int]], ...]:
    """A step's demotions (BF16 source, INT2 destination pages) split into those of pages it does not write
    (demoted before the forward: the chunk reads them as INT2) and those of pages it writes (after it)."""
    old: tuple[list[int], list[int]] = ([], [])
    own: tuple[list[int], list[int]] = ([], [])
    for p in plans:
        written = {s // page_size for s in p.slots if s >= 0}
        for src, dst in zip(p.demote_src, p.demote_dst):
            part = own if src in written else old
            part[0].append(src)
            part[1].append(dst)
    return old, own


def _cu(plans: list[WritePlan]) -> list[int]:
    """Chunk boundaries in the flat token batch ``[B + 1]``."""
    cu = [0]
    for p in plans:
        cu.append(cu[-1] + p.t1 - p.t0)
    return cu
