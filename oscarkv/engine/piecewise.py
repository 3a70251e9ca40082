"""CUDA graphs of long extend steps in pieces: every layer's work but its attention replayed, attention run eagerly.

Role: owned by :class:`~oscarkv.engine.model_runner.ModelRunner` beside the decode and extend graphs; used for a
step in which one sequence computes ``k`` tokens over its cached prefix, more than the extend graphs take
(:mod:`oscarkv.engine.extend_graphs`), up to a bucket of ``EngineConfig.piecewise_graph_buckets``: ``serve``'s
512-token prompt chunks and long follow-ups on a cached document. Eager, such a step is host-bound: ~25 launches a
layer at tens of µs of Python each (a 32K follow-up of 512 tokens: OSCAR 48.6 ms from 30.4 ms of kernels, BF16 30.8
from 25.6, one H200, 2026-11-28, ``lab/record/benchmarks-log.md``). Here a layer's work outside attention is one
graph replay: that follow-up 57.8 -> 35.0 ms, a cold 32K prompt in 512-token chunks 3.5 -> 1.7 s (OSCAR; BF16 42.9 ->
31.6 ms, 2.7 -> 1.3 s; ``lab.scripts.pieces_check``). On by default (``config.PIECEWISE_BUCKETS``), with tensor
parallelism too (tokens ≡ tp 1 on two H200s; ``lab.scripts.pieces_tp_check``).

What is captured, per bucket ``kb`` (at start-up; with tensor parallelism on every rank at once, rank 0's ``CAPTURE``
message, else at the first step that needs it): the model forward
``ids, positions [kb] -> hidden [kb, D]`` cut at every layer's attention core, ``AttentionBackend.extend`` (the
staged prefix, the chunk and their merge: its work and launches depend on the prefix length, so it is not
captured): ``L + 1`` graphs in one memory pool. Piece ``i`` ends with copies of layer ``i``'s mapped ``q, k, v``
into static buffers (one set per shape, shared by the layers; ``k`` and ``v`` each their own); at a replay the
runner then calls the backend's ``extend`` on them with the step's page tables and prefix lengths, and copies its
output into the static buffer piece ``i + 1`` starts from::

    replay piece 0 (embedding, layer 0 to its attention core)
    for each layer i: eager extend(q_i, k_i, v_i) -> out; replay piece i + 1 (o_proj, MLP, layer i + 1 ...)

Padding rows (``k < kb``): as the extend graphs' — after the real rows, token 0 at position 0, the scratch slot 0;
each layer's attention reads and writes the real rows alone (the padding's keep what they held: every other op is
row by row), and the runner keeps ``hidden[:k]``.

Demotions: the eager step's (``model_runner._demotions``): prefix pages before the replay, pages the step writes
after it.

Several sequences (``EngineConfig.piecewise_batches``, on: a served mix's TTFT 2.5-3x lower on one H200): their
rows one after another, padding after the last; each layer's attention gets the eager step's tables and chunk
boundaries and reads only the real rows (``_Step``). Not served (eager, counted in ``PiecewiseGraphs.fallbacks`` by
:meth:`PiecewiseGraphs.reason`): several sequences without it, sliding-window layers (their window view is per
step). With tensor parallelism every rank holds the same buckets and decides alike from the step's plans; each
captures its shard's pieces (the all-reduces inside them) at the same time, and rank 0's ids reach the others by
the runner's device broadcast after the staging, as in an extend graph.

Numerics: GEMMs of ``kb`` rows instead of ``k`` (other tiles), else the eager step's kernels: ≡ eager up to
rounding, as an extend graph. On a device without CUDA (the tests) nothing is captured: a replay runs the
forward eagerly over the same static buffers, attending as a replay does (``_Cut.step``), so the staging, the
padding, the tables and the demotions are what a GPU runs.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections import Counter
from dataclasses import replace

import torch

from oscarkv.attention.step import StepContext
from oscarkv.cache.manager import WritePlan
from oscarkv.engine.cuda_graphs import no_collection, warm_up
from oscarkv.engine.extend_graphs import _Inputs

log = logging.getLogger(__name__)


class _Cut:
    """The runner's backend seen by a piecewise forward: its ``extend`` is where a piece ends while
    :attr:`pieces` captures (else it is the runner's own); every other attribute is the runner's backend's."""

    def __init__(self, real) -> None:
        self.real = real
        self.pieces: _Pieces | None = None
        self.step: _Step | None = None
        """Set while a replay runs the forward eagerly (no CUDA): attention as a replay's (:meth:`_Step.attend`)."""
        self.shapes: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
        """``(which, shape, dtype)`` of every ``q``, ``k``, ``v`` seen (``which``: 0, 1, 2; the static buffers'
        kinds: ``k`` and ``v`` of one shape and dtype must not share one)."""

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def extend(self, q, k_new, v_new, kv, tables, cu_seqlens, scale, cu_host=None):
        if self.step is not None:  # a replay without CUDA
            out = self.step.attend(self.real, (q, k_new, v_new), kv, scale)
            return torch.cat([out, out.new_zeros((q.shape[0] - out.shape[0], *out.shape[1:]))])
        if self.pieces is None:  # warm-up
            self.shapes |= {(i, tuple(x.shape), x.dtype) for i, x in enumerate((q, k_new, v_new))}
            return self.real.extend(q, k_new, v_new, kv, tables, cu_seqlens, scale, cu_host)
        return self.pieces.cut((q, k_new, v_new), _Layer(kv, scale),
                               lambda a, b, c: self.real.extend(a, b, c, kv, tables, cu_seqlens, scale, cu_host))


class _Step:
    """What one replay's eager attention reads: the step's page tables, chunk boundaries (device and host) and real
    rows (the rest of the bucket is padding, whose output nothing reads)."""

    def __init__(self, tables, cu: torch.Tensor, cu_host: tuple[int, ...]) -> None:
        self.tables, self.cu, self.cu_host, self.rows = tables, cu, cu_host, cu_host[-1]

    def attend(self, real, qkv: tuple[torch.Tensor, ...], kv, scale: float) -> torch.Tensor:
        """``real.extend`` of the real rows of ``qkv``: ``[rows, Hq, d]``."""
        q, k, v = (x[:self.rows] for x in qkv)
        return real.extend(q, k, v, kv, self.tables, self.cu, scale, self.cu_host)


class _Layer:
    """What a layer's eager attention needs beside the step's tables: its pool view, the scale and its static
    ``q, k, v`` (set by :meth:`_Pieces.cut`)."""

    def __init__(self, kv, scale: float) -> None:
        self.kv, self.scale = kv, scale
        self.qkv: tuple[torch.Tensor, ...] = ()


class _Pieces:
    """Graphs captured one after another into ``pool`` (the capture's stream is the current one), and the layer
    whose eager attention runs after each but the last."""

    def __init__(self, pool, shapes: set, out_shape: tuple[int, ...], device: torch.device) -> None:
        self.pool, self.graphs, self.layers, self.open = pool, [], [], False
        # NOTE: zeros: at capture the eager attention reads them before any piece has run (its result is discarded)
        self.static = {key: torch.zeros(key[1], dtype=key[2], device=device) for key in shapes}
        self.out = torch.zeros(out_shape, dtype=torch.float32, device=device)

    def begin(self) -> None:
        self.graphs.append(torch.cuda.CUDAGraph())
        self.graphs[-1].capture_begin(pool=self.pool, capture_error_mode="thread_local")
        self.open = True

    def end(self) -> None:
        self.open = False
        self.graphs[-1].capture_end()

    def cut(self, qkv: tuple[torch.Tensor, ...], layer: _Layer, attend) -> torch.Tensor:
        """End the piece with ``qkv`` copied into the static buffers, run ``attend`` on them once (not
        captured), begin the next piece; the static output it starts from."""
        layer.qkv = tuple(self.static[(i, tuple(x.shape), x.dtype)] for i, x in enumerate(qkv))
        for dst, src in zip(layer.qkv, qkv):
            dst.copy_(src)
        self.end()
        self.out.copy_(attend(*layer.qkv))
        self.layers.append(layer)
        self.begin()
        return self.out

    def replay(self, attend) -> None:
        """Every piece in order, ``attend(layer) -> output`` between them (its rows into the one output every piece
        reads; padding rows keep what they held)."""
        for graph, layer in zip(self.graphs, [*self.layers, None]):
            graph.replay()
            if layer is not None:
                out = attend(layer)
                self.out[:out.shape[0]].copy_(out)


class _Graph:
    """One bucket's pieces over static inputs (:class:`~oscarkv.engine.extend_graphs._Inputs`): ``hidden [kb, D]``."""

    def __init__(self, runner, kb: int, pool) -> None:
        self.inputs = x = _Inputs(runner, kb)
        self.kb, self.cut = kb, _Cut(runner.backend)
        self.cu = torch.tensor([0, kb], dtype=torch.int32, device=runner.device)
        self.cus: dict[int, torch.Tensor] = {}  # [0, k]: a step's real rows (:meth:`one`)
        step = StepContext(self.cut, runner.pools, runner.storage, x.tables, self.cu, x.slots, runner.scale,
                           cu_host=(0, kb))
        self.forward = lambda: runner.model(x.ids, x.positions, step)
        self.pieces, self.hidden = None, None
        if pool is not None:
            self.pieces, self.hidden = _capture(self, runner, pool)

    def replay(self, step: _Step) -> torch.Tensor:
        """The bucket's forward over its staged inputs, each layer's attention as ``step`` says."""
        if self.pieces is None:  # no CUDA: the same forward, eagerly, attending as a replay does
            self.cut.step = step
            try:
                return self.forward()
            finally:
                self.cut.step = None
        real = self.cut.real
        self.pieces.replay(lambda layer: step.attend(real, layer.qkv, layer.kv, layer.scale))
        return self.hidden

    def one(self, plan: WritePlan, page_size: int) -> _Step:
        """The step of one sequence staged by ``inputs.stage``: its one-row tables and its real rows as the chunk
        (the padding rows after them are never attended: a follow-up of 300 tokens in the 512 bucket attends 300
        query rows over the prefix, not 512)."""
        lens = ((plan.view_bf16_len,), (len(plan.view_int2) * page_size,))
        tables = replace(self.inputs.tables, host_lens=lens)  # NOTE: the prefix lengths of this step, for the route
        k = plan.t1 - plan.t0
        if k not in self.cus:  # NOTE: one small device tensor per row count, not a copy per step
            self.cus[k] = torch.tensor([0, k], dtype=torch.int32, device=self.cu.device)
        return _Step(tables, self.cus[k], (0, k))


def _capture(graph: _Graph, runner, pool) -> tuple[_Pieces, torch.Tensor]:
    """Warm the forward up eagerly (Triton compiles, cuBLAS workspaces, the static buffers' kinds), then capture its
    pieces on a side stream: ``(pieces, hidden)``. The warm-up and the capture write only the scratch page."""
    dev = runner.device
    side = warm_up(graph.forward, dev)
    attn = runner.model.model.layers[0].self_attn
    pieces = _Pieces(pool, graph.cut.shapes, (graph.kb, attn.num_heads, attn.head_dim), dev)
    graph.cut.pieces = pieces
    # NOTE: as torch.cuda.graph: collect first, and no collection while capturing (a graph of a dropped engine freed
    # in a capture fails, and the pool stays recording: every later capture in the process failed)
    gc.collect()
    with no_collection():
        _capture_pieces(graph, pieces, side)
    torch.cuda.current_stream(dev).wait_stream(side)
    return pieces, graph.hidden_out


def _capture_pieces(graph: _Graph, pieces: _Pieces, side) -> None:
    try:
        with torch.cuda.stream(side):
            pieces.begin()
            graph.hidden_out = graph.forward()
            pieces.end()
        side.synchronize()
    finally:
        graph.cut.pieces = None
        if pieces.open:  # the forward raised mid-piece: end the capture (its graph is discarded), keep its error
            with contextlib.suppress(RuntimeError):
                pieces.end()


class PiecewiseGraphs:
    """Lazily captured piecewise graphs of one sequence's long extend steps per token bucket (module docstring)."""

    def __init__(self, runner, buckets: tuple[int, ...], batches: bool = False) -> None:
        self.runner, self.buckets, self.batches = runner, tuple(sorted(buckets)), batches
        self.graphs: dict[int, _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if runner.device.type == "cuda" else None
        self.replays = 0
        self.batched = 0
        """Replays of steps of several sequences (:attr:`batches`)."""
        self.fallbacks: Counter[str] = Counter()
        """Extend steps that ran eagerly, by :meth:`reason`."""

    def bucket(self, tokens: int) -> int | None:
        """The smallest bucket holding ``tokens`` rows (``None``: run eagerly)."""
        return next((b for b in self.buckets if b >= tokens), None)

    def reason(self, plans: list[WritePlan]) -> str | None:
        """Why an extend step of ``plans`` runs eagerly, or ``None``: the pieces run it. ``sequences``: not one
        sequence (unless :attr:`batches`); ``tokens``: one token, or more than the largest bucket; ``sliding``: the
        model has sliding-window layers. NOTE: a function of the plans and the model alone: every tensor-parallel rank decides alike."""
        if len(plans) != 1 and not self.batches:
            return "sequences"
        k = sum(p.t1 - p.t0 for p in plans)
        if k < 2 or self.bucket(k) is None:
            return "tokens"
        if self.runner.pools.sliding:
            return "sliding"
        return None

    def run(self, plans: list[WritePlan], ids: list[int], demotions: tuple, fill_ids=None,
            context: StepContext | None = None) -> torch.Tensor:
        """Demote the prefix's pages, stage, replay the bucket's pieces, demote the pages the step wrote
        (``demotions = (old, own)``, ``model_runner._demotions``): a view ``hidden [k, D]`` of the static output
        (valid until the bucket's next replay). ``fill_ids``: writes device ids the host's do not hold
        (``ModelRunner._fill_ids``: rank 0's, with tensor parallelism). Several sequences: ``context``, the eager
        step's (``ModelRunner.context``), gives the attention its page tables and chunk boundaries."""
        r, page = self.runner, self.runner.pools.geo.page_size
        old, own = demotions
        r.demote_all(*old)
        g = self.graphs[self.capture(len(ids))]
        if len(plans) == 1:
            g.inputs.stage(plans[0], ids, page)
            step = g.one(plans[0], page)
        else:
            g.inputs.stage_tokens(ids, [t for p in plans for t in range(p.t0, p.t1)], [s for p in plans for s in p.slots])
            step = _Step(context.tables, context.cu_seqlens, context.cu_host)
            self.batched += 1
        if fill_ids is not None:
            fill_ids(g.inputs.ids)
        self.replays += 1
        hidden = g.replay(step)[:len(ids)]
        r.demote_all(*own)
        return hidden

    def capture_all(self) -> None:
        """Capture every bucket now (at start-up), logging the graphs, the seconds and the device memory taken."""
        dev, t = self.runner.device, time.perf_counter()
        reserved = (lambda: torch.cuda.memory_reserved(dev)) if dev.type == "cuda" else (lambda: 0)
        before = reserved()
        for kb in self.buckets:
            self.capture(kb)
        graphs = sum(len(g.pieces.graphs) for g in self.graphs.values() if g.pieces is not None)
        log.info("oscarkv piecewise graphs: buckets %s, %d graphs in %.1f s, %.0f MiB", self.buckets, graphs,
                 time.perf_counter() - t, (reserved() - before) / 2**20)

    def capture(self, tokens: int) -> int:
        """Build (on CUDA: capture) the pieces of ``tokens``' bucket unless they exist; the bucket."""
        kb = self.bucket(tokens)
        if kb not in self.graphs:
            self.graphs[kb] = _Graph(self.runner, kb, self.pool)
        return kb
