"""CUDA graphs of the decode step, one per batch bucket, and the staging of their inputs.

Role: owned by :class:`~oscarkv.engine.model_runner.ModelRunner`; used for a pure decode step
(one token per sequence) of a backend with ``decode_steps``. What is captured, per bucket
``Bp`` in :data:`DEFAULT_BUCKETS` (lazily, at the first step that needs it): the whole model
forward ``ids, positions [Bp] -> hidden [Bp, D]`` — embedding, every layer's projections,
QK-norm, RoPE, the write kernel, the query rotation, the decode kernel (split-K + merge), o_proj
and MLP — the final norm and the logits ``[Bp, V]`` (fp32), over static input buffers. With tensor
parallelism (``oscarkv.engine.workers``) every rank captures its shard at the same step, the
row-parallel all-reduces inside the graph, each rank forms the logits of its share of the vocabulary and
rank 0 gathers them (``oscarkv.models.parallel.graph_logits``).

Inputs arrive as host lists (:class:`DecodeInputs`, built by the runner from the scheduler's
plans) and are staged without building per-step tensors: ``ids, positions, slots, bf16_lens,
int2_lens`` go through one pinned host buffer and one copy; the page tables are
:class:`StagedTable` s, device tables that upload only the part of a row that changed since the
last step (a decode step usually changes none: a row gains a page every ``P`` steps, and the
BF16 view shifts by a page when one is demoted).

Not in the step's graph (before the replay): the demotions of the step, every layer in one launch
per clip rank (``AttentionBackend.demote_all``; they read full BF16 pages that this step does
not write, so running them before the forward gives the same bytes as running them inside
each layer). Pools with no one tensor for every layer's history (a per-layer or per-head allocation,
sliding layers) demote with launches per layer and head range, whose host work a graph of its own replaces
(:class:`DemoteGraphs`).

Padding rows (``B < Bp``): token 0 at position 0, write slot 0 of the scratch page 0 (owned by
no sequence, see ``oscarkv.cache.paged_layout``), lengths 0, so the decode kernel reads
nothing for them and outputs zeros. All buckets share one graph memory pool.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

import torch

from oscarkv.cache.paged_layout import PageTables, device_tensor
from oscarkv.attention.step import StepContext
from oscarkv.models.parallel import graph_logits

DEFAULT_BUCKETS = (1, 2, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)
"""Batch buckets. NOTE: steps of 2 to 8, of 4 to 32, then of 8 (not powers of two): the decode
kernel's split count is fixed per bucket (``decode.default_splits`` of ``Bp``, filling the GPU at
``Bp`` rows), so a batch far below its bucket leaves resident slots idle: 26 sequences in a bucket
of 32 ran 6 splits, 1 248 of 1 584 programs on an H100, and the INT2 kernel read at 71% of copy
(lab/record/benchmarks-log.md, fourth session). Graphs are captured lazily, for the buckets a workload uses."""


@dataclass
class DecodeInputs:
    """One decode step on the host: row ``i`` is sequence ``i`` of the batch (made by the runner)."""

    ids: list[int]  # [B] the token each sequence computes
    positions: list[int]  # [B]
    slots: list[int]  # [B] flat BF16 slot of its K/V
    bf16_rows: list[list[int]]  # BF16 pages of each view, the new token included (sink, then recent)
    bf16_lens: list[int]
    int2_rows: list[list[int]]  # INT2 history pages of each view
    int2_lens: list[int]
    demote_src: list[int]  # BF16 pages demoted this step ...
    demote_dst: list[int]  # ... into these INT2 pages


class StagedTable:
    """A device ``int32 [rows, width]`` table set row by row from lists; only a row's changed tail is copied.

    NOTE: the host side is a pinned mirror of the device table, written before each
    asynchronous copy; :meth:`wait` (before writing it again) makes sure the previous copies
    have read it."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.device_table = torch.zeros(rows, width, dtype=torch.int32, device=device)
        self.host = torch.zeros(rows, width, dtype=torch.int32, pin_memory=pin)
        self._np = self.host.numpy()
        self.rows: list[list[int]] = [[] for _ in range(rows)]
        self.uploads = 0  # row uploads so far (a statistic for tests and benchmarks)

    def set_row(self, i: int, values: list[int]) -> None:
        old = self.rows[i]
        start = len(old) if len(values) >= len(old) and values[:len(old)] == old else 0  # usually: appended pages
        end = len(values)
        if start < end:
            self._np[i, start:end] = values[start:]
            self.device_table[i, start:end].copy_(self.host[i, start:end], non_blocking=True)
            self.uploads += 1
        self.rows[i] = values


class _Inputs:
    """Static device inputs of one bucket: a packed ``[5, Bp]`` vector block and two staged tables."""

    IDS, POS, SLOTS, BF16_LENS, INT2_LENS = range(5)

    def __init__(self, runner, bp: int) -> None:
        dev, geo = runner.device, runner.pools.geo
        self.bp, self.device = bp, dev
        self.small = torch.zeros(5, bp, dtype=torch.int32, device=dev)
        self.small_host = torch.zeros(5, bp, dtype=torch.int32, pin_memory=dev.type == "cuda")
        self.bf16 = StagedTable(bp, geo.bf16_pages, dev)
        self.int2 = StagedTable(bp, max(1, geo.int2_pages), dev)
        self.copied = torch.cuda.Event() if dev.type == "cuda" else None
        self.tables = PageTables(self.bf16.device_table, self.small[self.BF16_LENS],
                                 self.int2.device_table, self.small[self.INT2_LENS])

    def stage(self, x: DecodeInputs) -> None:
        """Copy one step's inputs in (padding rows: zeros); asynchronous, from pinned memory."""
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copies have read the host buffers
        b, h = len(x.ids), self.small_host.numpy()
        h[:, b:] = 0
        for row, values in ((self.IDS, x.ids), (self.POS, x.positions), (self.SLOTS, x.slots),
                            (self.BF16_LENS, x.bf16_lens), (self.INT2_LENS, x.int2_lens)):
            h[row, :b] = values
        self.small.copy_(self.small_host, non_blocking=True)
        for i in range(b):
            self.bf16.set_row(i, x.bf16_rows[i])
            self.int2.set_row(i, x.int2_rows[i])
        if self.copied is not None:
            self.copied.record()


def warm_up(forward, dev: torch.device) -> torch.cuda.Stream:
    """Run ``forward`` twice on a new side stream and wait: every Triton kernel compiled and loaded, every per-stream
    library workspace (cuBLAS) made, before a capture on that stream (the returned one)."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            forward()
    side.synchronize()
    return side


def _capture(forward, dev: torch.device, pool, tries: int = 2):
    """Warm ``forward`` up eagerly, then capture it: ``(graph, output)``.

    NOTE: warm-up and capture run on the same side stream, so every Triton kernel is compiled
    and loaded, and every per-stream library workspace (cuBLAS) exists, before capture starts;
    ``thread_local`` capture keeps CUDA calls of other threads from invalidating it. A capture
    that is still invalidated (``cudaErrorStreamCaptureInvalidated``, seen once in an H100 test
    run, 2026-11-22) is retried from a fresh graph; the warm-up writes only the scratch page.
    NOTE: with tensor parallelism a retry on one rank alone would pair its captured all-reduces with
    another step's on the others; the ranks then fall out of step and the engine fails its requests
    (``workers.WorkerDied``) rather than hang."""
    side = warm_up(forward, dev)
    for attempt in range(tries):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"), no_collection():
                out = forward()
            return graph, out
        except RuntimeError as e:
            if attempt + 1 == tries or "capture" not in str(e).lower():
                raise
            torch.cuda.synchronize(dev)


@contextlib.contextmanager
def no_collection():
    """No garbage collection inside: a collection during a capture frees the graphs of dropped engines, and a graph's
    reset is not permitted while a stream captures (the capture fails; seen in a GPU test run, 2026-11-28)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class _Graph:
    """One captured decode step over the static inputs of ``bp`` rows: ``hidden [bp, D]``, ``logits [bp, V]``."""

    def __init__(self, runner, bp: int, pool) -> None:
        self.inputs = x = _Inputs(runner, bp)
        i32 = dict(dtype=torch.int32, device=runner.device)
        step = StepContext(runner.backend, runner.pools, runner.storage, x.tables, torch.arange(bp + 1, **i32),
                           x.small[x.SLOTS], runner.scale, decode=True)

        def forward():  # NOTE: with tensor parallelism the row-parallel all-reduces are captured too
            hidden = runner.model(x.small[x.IDS], x.small[x.POS], step)
            return hidden, graph_logits(runner.model, hidden, runner.tp)  # rank 0's (a gather with tp > 1)

        self.graph, (self.hidden, self.logits) = _capture(forward, runner.device, pool)

    def replay(self, x: DecodeInputs, fill_ids=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.inputs.stage(x)
        if fill_ids is not None:  # ids still on the device (overlap) or on rank 0 (tensor parallel), after the staging copy
            fill_ids(self.inputs.small[self.inputs.IDS])
        self.graph.replay()
        b = len(x.ids)
        return self.hidden[:b], None if self.logits is None else self.logits[:b]


class DecodeGraphs:
    """Lazily captured decode graphs per batch bucket (see the module docstring)."""

    def __init__(self, runner, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        self.runner, self.buckets = runner, tuple(sorted(buckets))
        self.graphs: dict[int, _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def bucket(self, batch: int) -> int | None:
        """The smallest bucket holding ``batch`` rows (``None``: run eagerly)."""
        return next((b for b in self.buckets if b >= batch), None)

    def run(self, x: DecodeInputs, fill_ids=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Demote eagerly, then replay the bucket's graph: views ``hidden [B, D]``, ``logits [B, V]``
        of its static outputs (valid until the next replay; no logits on tensor-parallel ranks after 0).
        ``fill_ids``: writes the device ids that ``x`` does not hold (``ModelRunner._fill_ids``)."""
        self.runner.demote_all(x.demote_src, x.demote_dst)
        return self.graphs[self.capture(len(x.ids))].replay(x, fill_ids)

    def capture(self, batch: int) -> int:
        """Capture the graph of ``batch``'s bucket unless it exists (capturing writes only the scratch page, so at
        any time between steps); the bucket."""
        bp = self.bucket(batch)
        if bp not in self.graphs:
            self.graphs[bp] = _Graph(self.runner, bp, self.pool)
        return bp


def padded_pages(src: list[int], dst: list[int], n: int) -> list[int]:
    """``src`` then ``dst``, each padded to ``n`` by repeating its last page (a page encoded twice into the same
    place writes the same bytes): one staging copy of a demotion bucket."""
    pad = n - len(src)
    return src + src[-1:] * pad + dst + dst[-1:] * pad


class DemoteGraphs:
    """A step's demotions as CUDA graph replays, one graph per bucket of page counts (powers of two up to ``cap``;
    more pages: several replays of the largest). For pools demoted with launches per layer and head range
    (:meth:`wanted`): their host work made each page boundary of the 45-head recipe of pages of 16 cost ~34 ms
    eagerly at the Qwen3-8B shape (two launches per layer and range, H100, 2026-11-28,
    ``lab/bench_gpu/2026-11-28/heads_p16_h100``), against ~0.6 ms for two launches over one pool."""

    def __init__(self, runner, cap: int = 64) -> None:
        self.runner = runner
        self.buckets = tuple(1 << i for i in range(cap.bit_length()) if 1 << i <= cap)
        self.graphs: dict[int, tuple[torch.Tensor, torch.cuda.CUDAGraph]] = {}
        self.pool = torch.cuda.graph_pool_handle()

    @staticmethod
    def wanted(pools) -> bool:
        """Whether ``pools`` demote layer by layer (``TritonAttention.demote_all``): history pages, no one tensor
        for them (BF16 pools have none: nothing to demote)."""
        return bool(pools.geo.int2_pages) and (pools.int2_k is None or bool(pools.sliding))

    def run(self, src: list[int], dst: list[int]) -> None:
        """Demote BF16 pages ``src`` into INT2 pages ``dst`` in every layer (asynchronous)."""
        top = self.buckets[-1]
        for i in range(0, len(src), top):
            s, d = src[i:i + top], dst[i:i + top]
            pages, graph = self.capture(next(b for b in self.buckets if b >= len(s)))
            pages.copy_(device_tensor(padded_pages(s, d, pages.shape[1]), pages.device).view(pages.shape))
            graph.replay()

    def capture(self, n: int) -> tuple[torch.Tensor, torch.cuda.CUDAGraph]:
        """The graph of bucket ``n`` and its page buffer ``[2, n]`` (src, dst), captured unless it exists
        (:func:`_capture`): the warm-up (Triton compiles) and the capture demote the scratch page 0 into itself,
        which no sequence owns."""
        if n not in self.graphs:
            r = self.runner
            pages = torch.zeros(2, n, dtype=torch.int32, device=r.device)
            graph, _ = _capture(lambda: r.backend.demote_all(r.pools, r.storage, pages[0], pages[1]), r.device,
                                self.pool)
            self.graphs[n] = (pages, graph)
        return self.graphs[n]
