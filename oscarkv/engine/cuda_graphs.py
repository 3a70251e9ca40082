"""CUDA graphs of the decode forward, one per batch bucket.

Role: owned by :class:`~oscarkv.engine.model_runner.ModelRunner`; used for a pure decode step
(one token per sequence) of a backend with ``decode_steps``. What is captured, per bucket
``Bp`` in :data:`DEFAULT_BUCKETS` (lazily, at the first step that needs it): the whole model
forward ``ids, positions [Bp] -> hidden [Bp, D]`` — embedding, every layer's projections,
QK-norm, RoPE, the mapping of K/V into the stored domain, the write kernel, the query
rotation, the decode kernel (split-K + merge), o_proj and MLP — and the final norm, over
static input buffers: ``ids, positions, slots [Bp]``, ``bf16_table [Bp, N_bf16]``,
``int2_table [Bp, N_int2]``, ``bf16_lens, int2_lens [Bp]`` (tables as wide as the pools, so
any step fits).

Not captured (eager, around the replay): copying the step's tables into the static buffers,
the demotions of the step (one launch per layer, only in steps that demote: they read full
BF16 pages that this step does not write, so running them before the forward gives the same
bytes as running them inside each layer), and the logits (``compute_logits`` of the rows that
sample).

Padding rows (``B < Bp``): token 0 at position 0, write slot 0 of the scratch page 0 (owned by
no sequence, see ``oscarkv.cache.paged_layout``), lengths 0, so the decode kernel reads
nothing for them and outputs zeros. All buckets share one graph memory pool.
"""

from __future__ import annotations

import torch

from oscarkv.cache.paged_layout import PageTables
from oscarkv.engine.attention import StepContext

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def _capture(forward, dev: torch.device, pool, tries: int = 2):
    """Warm ``forward`` up eagerly, then capture it: ``(graph, output)``.

    NOTE: warm-up and capture run on the same side stream, so every Triton kernel is compiled
    and loaded, and every per-stream library workspace (cuBLAS) exists, before capture starts;
    ``thread_local`` capture keeps CUDA calls of other threads from invalidating it. A capture
    that is still invalidated (``cudaErrorStreamCaptureInvalidated``, seen once in an H100 test
    run, 2026-11-22) is retried from a fresh graph; the warm-up writes only the scratch page."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            forward()
    side.synchronize()
    for attempt in range(tries):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
                out = forward()
            return graph, out
        except RuntimeError as e:
            if attempt + 1 == tries or "capture" not in str(e).lower():
                raise
            torch.cuda.synchronize(dev)


class _Graph:
    """One captured decode forward over static buffers of ``bp`` rows."""

    def __init__(self, runner, bp: int, pool) -> None:
        dev, geo = runner.device, runner.pools.geo
        i32 = dict(dtype=torch.int32, device=dev)
        self.ids = torch.zeros(bp, dtype=torch.long, device=dev)
        self.pos = torch.zeros(bp, dtype=torch.long, device=dev)
        self.tables = PageTables(torch.zeros(bp, geo.bf16_pages, **i32), torch.zeros(bp, **i32),
                                 torch.zeros(bp, max(1, geo.int2_pages), **i32), torch.zeros(bp, **i32))
        self.slots = torch.zeros(bp, **i32)
        empty = torch.zeros(0, **i32)
        step = StepContext(runner.backend, runner.pools, runner.storage, self.tables,
                           torch.arange(bp + 1, **i32), self.slots, empty, empty, runner.scale, decode=True)
        self.graph, self.hidden = _capture(lambda: runner.model(self.ids, self.pos, step), dev, pool)  # [bp, D]

    def replay(self, ids: torch.Tensor, pos: torch.Tensor, step: StepContext) -> torch.Tensor:
        b = ids.shape[0]
        self.ids[:b].copy_(ids)
        self.pos[:b].copy_(pos)
        self.slots[:b].copy_(step.slots)
        self.slots[b:].zero_()  # padding rows write into the scratch page
        for static, t in ((self.tables.bf16_table, step.tables.bf16_table),
                          (self.tables.int2_table, step.tables.int2_table)):
            static[:b, :t.shape[1]].copy_(t)  # entries past a row's length are never read
        for static, t in ((self.tables.bf16_lens, step.tables.bf16_lens), (self.tables.int2_lens, step.tables.int2_lens)):
            static[:b].copy_(t)
            static[b:].zero_()
        self.graph.replay()
        return self.hidden[:b].clone()


class DecodeGraphs:
    """Lazily captured decode graphs per batch bucket (see the module docstring)."""

    def __init__(self, runner, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        self.runner, self.buckets = runner, tuple(sorted(buckets))
        self.graphs: dict[int, _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def bucket(self, batch: int) -> int | None:
        """The smallest bucket holding ``batch`` rows (``None``: run eagerly)."""
        return next((b for b in self.buckets if b >= batch), None)

    def run(self, ids: torch.Tensor, pos: torch.Tensor, step: StepContext) -> torch.Tensor:
        """Demote eagerly, then replay the bucket's graph: ``hidden [B, D]``."""
        r = self.runner
        if step.demote_src.numel():
            for i, st in enumerate(r.storage):
                r.backend.demote(r.pools.layer(i), st.key, st.value, step.demote_src, step.demote_dst)
        bp = self.bucket(ids.shape[0])
        if bp not in self.graphs:
            self.graphs[bp] = _Graph(r, bp, self.pool)
        return self.graphs[bp].replay(ids, pos, step)
