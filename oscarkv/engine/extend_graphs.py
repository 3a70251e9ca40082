"""CUDA graphs of short extend steps of one sequence, one per token bucket, and the staging of their inputs.

Role: owned by :class:`~oscarkv.engine.model_runner.ModelRunner` beside the decode graphs
(:mod:`oscarkv.engine.cuda_graphs`); used for a step in which one sequence computes ``2 <= k <= kb`` tokens over
its cached prefix — the first step of a follow-up request on a cached document, a speculative verify chunk
(``oscarkv.engine.speculative``) — when the eager route of that shape is the split-K chunk kernel
(:mod:`oscarkv.kernels.chunk_splitk`: ``serves`` the layout and ``prefers_splitk`` the shape). A one-token step
is a decode step and replays a decode graph instead.

What is captured, per bucket ``kb`` of ``EngineConfig.extend_graph_buckets`` (lazily, at the first step that
needs it): the model forward ``ids, positions [kb] -> hidden [kb, D]`` of an extend step (``StepContext.decode``
off: projections, QK-norm, RoPE, the stored-domain maps, the write kernel, the query map, o_proj, MLP) whose
attention is :func:`~oscarkv.kernels.chunk_splitk.chunk_attention` over ``cu_seqlens = [0, kb]`` at
``max_chunk = kb``: one fixed grid; then every row's logits (one GPU; the runner takes the rows that sample: the
last real row of a follow-up, every row of a verify chunk).

Padding rows (``k < kb``) are chunk tokens after the real ones: token 0 at position 0, written to slot 0 of the
scratch page 0 (owned by no sequence, ``oscarkv.cache.paged_layout``). The chunk is causal, so no real row
attends to a padding row; a padding row only reads the prefix and writes the scratch slot, and the runner keeps
``hidden[:k]``: nothing stored changes and it is never sampled.

Numerics: the eager route's kernel at ``max_chunk = kb`` instead of ``k`` (other tile rows and split count, so
sums in another order) and GEMMs of ``kb`` rows (the lm_head's too): graph ≡ eager up to rounding, as a decode
graph's bucket.

Not captured (eager, before the replay): the step's demotions (``ModelRunner.demote_all``). NOTE: valid only
because a demoted page is not one the step writes (those an eager step demotes after its forward);
:meth:`ExtendGraphs.reason` sends a step that would to the eager path.

Longer steps (``staged`` buckets, the piecewise graphs' by default): the staged path's host work (cuDNN calls,
layout copies, gathers sized by the prefix) ran eagerly between piecewise graphs, ~0.5 ms a layer, twice the GPU's
at 64 tokens over 32K. Its work depends on the prefix's BF16 and INT2 lengths, so a graph is captured per
``(bucket, lengths)`` (:class:`_FixedLens`: the step's attention sees them as host ints), once a key repeats — many
questions over one cached document resume at one length; each turn of a growing chat is a new one, eager as
before — and the last ``STAGED_GRAPHS`` are kept. An INT2 chunk of ``prefill.MIN_CHUNK`` to 64 tokens over a long
prefix, which split-K takes in a short bucket's graph, moves to a staged graph when its key repeats (the staged
path 0.37 ms a layer at 100K, 64 tokens, against split-K's 0.57; NOTE: not yet timed end to end).

Every other extend step runs eagerly; :meth:`ExtendGraphs.reason` names why, counted in ``ExtendGraphs.fallbacks``.
On a device without CUDA (the tests) nothing is captured: each replay runs the same forward over the same
static buffers eagerly, so the staging, padding and routing are what a GPU replays.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import replace

import torch

from oscarkv.attention.backends import TritonAttention
from oscarkv.attention.step import StepContext, by_head_ranges
from oscarkv.cache.manager import WritePlan
from oscarkv.cache.paged_layout import PageTables
from oscarkv.engine.cuda_graphs import StagedTable, _capture
from oscarkv.engine.speculative import greedy_pair
from oscarkv.models.parallel import graph_logits

log = logging.getLogger(__name__)


class _FixedSplitK(TritonAttention):
    """The Triton backend whose ``extend`` is always the split-K chunk kernel at ``max_chunk`` (a fixed grid); a layer
    a per-head allocation splits, one launch per head range (as the eager route takes it)."""

    def __init__(self, max_chunk: int) -> None:
        self.max_chunk = max_chunk

    def extend(self, q, k_new, v_new, kv, tables, cu_seqlens, scale, cu_host=None):
        from oscarkv.kernels.chunk_splitk import chunk_attention
        from oscarkv.kernels.pools import rows_contiguous

        if kv.split is not None:
            return by_head_ranges(kv, lambda q_, k_, v_, kv_: self.extend(q_, k_, v_, kv_, tables, cu_seqlens, scale),
                                  q, (k_new, v_new))
        return chunk_attention(rows_contiguous(q), rows_contiguous(k_new), rows_contiguous(v_new), kv, tables,
                               cu_seqlens, scale, max_chunk=self.max_chunk)


STAGED_GRAPHS = 4
"""Staged graphs kept (the least recently replayed dropped): each holds its own CUDA graph, its activations in
the shared pool. One H200, 2026-11-29 (``FSERVED_REPEATS=3 FSERVED_KS=1,8,64,256,512 gpu_untimed.sh fserved``,
``lab/bench_gpu/2026-11-28/s20_call{10,11}_h200``), Qwen3-4B, ms of a third question on one cached document (its
graph replayed) against the same step eager on four machines that day (calls 7, 8, 11; it is host-bound, so the
host's speed decides): 32K BF16 k = 64 12.8-12.9 against 22.7-28.3, k = 256 20.2-20.9 against 21.3-32.8, k = 512
30.3 against 31.3-37.9; OSCAR k = 256 19.2-21.6 against 21.6-28.1; 100K BF16 k = 64 27.5 against 26.4-43.8. The
second question captures: 125-250 ms, once a key."""


SIGHTINGS = 64
"""Staged keys remembered without a graph (the oldest forgotten)."""


class _FixedLens:
    """The runner's backend for one staged graph: its ``extend`` sees the prefix as ``lens`` (host ints, the graph's
    key), one chunk of ``kb`` rows; every other attribute is the backend's."""

    def __init__(self, real, lens: tuple[tuple[int], tuple[int]], kb: int) -> None:
        self.real, self.lens, self.kb = real, lens, kb

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def extend(self, q, k_new, v_new, kv, tables, cu_seqlens, scale, cu_host=None):
        if isinstance(self.real, TritonAttention):  # NOTE: the staged path whatever the shape's route (split-K's)
            from oscarkv.kernels.prefill import prefill_attention

            return prefill_attention(q, k_new, v_new, kv, tables, 0, (self.lens[0][0], self.lens[1][0]), scale)
        return self.real.extend(q, k_new, v_new, kv, replace(tables, host_lens=self.lens), cu_seqlens, scale,
                                (0, self.kb))


class _Inputs:
    """Static device inputs of one bucket: ``vec int32 [3 kb + 2]`` (ids, positions, slots, then the BF16 and
    INT2 prefix lengths) through one pinned host buffer, and one-row staged page tables."""

    def __init__(self, runner, kb: int) -> None:
        dev, geo = runner.device, runner.pools.geo
        self.kb, cuda = kb, dev.type == "cuda"
        self.vec = torch.zeros(3 * kb + 2, dtype=torch.int32, device=dev)
        self.host = torch.zeros(3 * kb + 2, dtype=torch.int32, pin_memory=cuda)
        self.bf16 = StagedTable(1, geo.bf16_pages, dev)
        self.int2 = StagedTable(1, max(1, geo.int2_pages), dev)
        self.copied = torch.cuda.Event() if cuda else None
        self.ids, self.positions, self.slots = self.vec[:kb], self.vec[kb:2 * kb], self.vec[2 * kb:3 * kb]
        self.tables = PageTables(self.bf16.device_table, self.vec[3 * kb:3 * kb + 1],
                                 self.int2.device_table, self.vec[3 * kb + 1:])

    def stage(self, plan: WritePlan, ids: list[int], page_size: int) -> None:
        """Copy one step's inputs in (padding rows: token 0, position 0, scratch slot 0); asynchronous."""
        self.stage_tokens(ids, range(plan.t0, plan.t1), plan.slots, plan, page_size)

    def stage_tokens(self, ids: list[int], positions, slots: list[int], plan: WritePlan | None = None,
                     page_size: int = 0) -> None:
        """Copy the rows' ids, positions and slots in (padding as :meth:`stage`'s) and, given ``plan``, its prefix
        view as the one-row tables; asynchronous. Without ``plan`` (several sequences' rows, a piecewise replay) the
        one-row tables are not staged: the step's own are read."""
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copies have read the host buffers
        kb, k, h = self.kb, len(ids), self.host.numpy()
        h[:] = 0
        h[:k], h[kb:kb + k], h[2 * kb:2 * kb + k] = ids, positions, slots
        if plan is not None:
            h[3 * kb:] = plan.view_bf16_len, len(plan.view_int2) * page_size
        self.vec.copy_(self.host, non_blocking=True)
        if plan is not None:
            self.bf16.set_row(0, plan.view_bf16)
            self.int2.set_row(0, plan.view_int2)
        if self.copied is not None:
            self.copied.record()


class _Graph:
    """One captured extend step of ``kb`` tokens over the static inputs: ``hidden [kb, D]`` and, for a short bucket
    (``backend`` unset), the logits of every row ``[kb, V]`` (rank 0's: a verify step samples every row, a
    follow-up its last; the lm_head's weights are read once for any rows, and the step saves the row gather,
    its index copy and the eager head); a staged graph's up to 512 rows leave them to the runner."""

    def __init__(self, runner, kb: int, pool, backend=None, greedy: bool = False) -> None:
        self.inputs = x = _Inputs(runner, kb)
        i32 = dict(dtype=torch.int32, device=runner.device)
        logits = backend is None and runner.tp.size == 1  # NOTE: tensor-parallel ranks form them after the replay
        if backend is None:
            backend = _FixedSplitK(kb) if isinstance(runner.backend, TritonAttention) else runner.backend
        step = StepContext(backend, runner.pools, runner.storage, x.tables, torch.tensor([0, kb], **i32),
                           x.slots, runner.scale)

        host = torch.empty(2, kb, pin_memory=True) if greedy and logits and pool is not None else None

        def forward():
            hidden = runner.model(x.ids, x.positions, step)
            out = graph_logits(runner.model, hidden, runner.tp) if logits else None
            pair = greedy_pair(out) if greedy and out is not None else None
            if host is not None:  # CUDA: the graph copies the pair to pinned memory itself (read after a stream sync)
                pair = host.copy_(pair, non_blocking=True)
            return hidden, out, pair

        self.forward = forward
        self.graph, self.outputs = _capture(forward, runner.device, pool) if pool is not None else (None, None)

    def replay(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``hidden [kb, D]``, ``logits [kb, V]`` and their ``greedy_pair [2, kb]`` (each ``None`` where not formed)."""
        if self.graph is None:  # no CUDA: the same forward, eagerly
            return self.forward()
        self.graph.replay()
        return self.outputs


class ExtendGraphs:
    """Lazily captured extend graphs of one sequence per token bucket (see the module docstring)."""

    def __init__(self, runner, buckets: tuple[int, ...], staged: tuple[int, ...] = (), greedy: bool = False) -> None:
        """``greedy``: short buckets' graphs also form their logits' ``speculative.greedy_pair`` (an engine that
        speculates: a greedy verify step then reads its tokens with one copy, :meth:`take_greedy`)."""
        from oscarkv.kernels.chunk_splitk import serves

        self.runner, self.buckets, self.staged_buckets = runner, tuple(sorted(buckets)), tuple(sorted(staged))
        self.greedy, self._pair = greedy, None
        self.graphs: dict[int, _Graph] = {}
        self.staged: OrderedDict[tuple[int, int, int], _Graph] = OrderedDict()
        """Staged graphs by ``(bucket, BF16 prefix tokens, INT2 prefix tokens)``, least recently replayed first."""
        self.sightings: Counter[tuple[int, int, int]] = Counter()
        """Staged keys met without a graph (the second sighting captures)."""
        self.pool = torch.cuda.graph_pool_handle() if runner.device.type == "cuda" else None
        # NOTE: another backend (the CPU's oracles) has one extend route for every shape
        self.splitk = isinstance(runner.backend, TritonAttention)
        self.serves = not self.splitk or all(serves(kv) for i in runner.pools.model_layers()
                                                 for _, kv in runner.pools.parts(i))
        self.replays = 0
        self.fallbacks: Counter[str] = Counter()
        """Extend steps that ran eagerly, by :meth:`reason`."""

    def bucket(self, tokens: int) -> int | None:
        """The smallest bucket holding ``tokens`` rows (``None``: run eagerly)."""
        return next((b for b in self.buckets if b >= tokens), None)

    def reason(self, plans: list[WritePlan]) -> str | None:
        """Why an extend step of ``plans`` runs eagerly, or ``None``: a graph runs it. ``sequences``: not one
        sequence; ``tokens``: one token, or more than the largest bucket; ``route``: the eager route of the shape is not the
        split-K kernel (or the layout is not one it reads); ``demotes_written``: a page it demotes is one it writes;
        ``staged_first``: a staged key met the first time (counted: the next meeting captures its graph, here);
        ``staged_memory``: that capture ran out of device memory (staged graphs stop)."""
        if len(plans) != 1:
            return "sequences"
        p, page = plans[0], self.runner.pools.geo.page_size
        k, key = p.t1 - p.t0, self._staged_key(p)
        if key is None and (k < 2 or self.bucket(k) is None):  # NOTE: one token only with a backend without decode steps
            return "tokens"
        if key is None and (not self.serves or (self.splitk and not _prefers_splitk(k, p, page))):
            return "route"
        if set(p.demote_src) & {s // page for s in p.slots}:
            return "demotes_written"
        if key is None or key in self.staged:
            return None
        if not self.sightings[key]:  # NOTE: a chunk the short buckets take keeps their graph (split-K) meanwhile
            self._sighted(key)
            return None if self._short(p) else "staged_first"
        return self._capture_staged(key)

    def _short(self, p: WritePlan) -> bool:
        """Whether the short buckets take ``p``'s step (their eager route split-K, or any route with another
        backend)."""
        k, page = p.t1 - p.t0, self.runner.pools.geo.page_size
        return k >= 2 and self.bucket(k) is not None and self.serves and (not self.splitk or _prefers_splitk(k, p, page))

    def _sighted(self, key: tuple[int, int, int]) -> None:
        self.sightings[key] += 1
        while len(self.sightings) > SIGHTINGS:  # the oldest first
            del self.sightings[next(iter(self.sightings))]

    def _staged_key(self, p: WritePlan) -> tuple[int, int, int] | None:
        """The staged graph key of ``p``'s step: ``(bucket, BF16 prefix tokens, INT2 prefix tokens)``, or ``None``:
        no staged bucket holds it, it is not the first step after a prefix-cache hit (``WritePlan.after_hit``: a cold
        prompt's chunks meet each length once), the short buckets take it (:meth:`_short`) but for an INT2 chunk of
        ``MIN_CHUNK`` to 64 tokens (split-K in a graph until its key repeats, then the staged path's graph: 0.37
        against 0.57 ms a layer at 100K), or the pools have sliding layers (whose windows the piecewise graphs
        leave eager)."""
        from oscarkv.kernels.prefill import MIN_CHUNK

        k, page = p.t1 - p.t0, self.runner.pools.geo.page_size
        kb = next((b for b in self.staged_buckets if b >= k), None)
        if kb is None or not p.after_hit or self.runner.pools.sliding:  # NOTE: a cold prompt's chunks never repeat
            return None
        if self._short(p) and not (self.splitk and k >= MIN_CHUNK):  # NOTE: split-K up to 64 INT2 tokens upgrades
            return None
        return kb, p.view_bf16_len, len(p.view_int2) * page

    def verifies(self, plans: list[WritePlan]) -> bool:
        """Whether a verify step of ``plans`` (one chunk of ``1 + K`` tokens) runs as one chunk here rather than as
        ``1 + K`` decode rows: when a graph covers it and the backend's decode steps read their own token as stored
        (``decode_steps``), which the chunk kernel's rows do for their chunk's earlier tokens (rounded to bf16 for
        the products, as stored): then a row computes what its decode row would, up to rounding order."""
        return self.runner.backend.decode_steps and self.reason(plans) is None

    def run(self, plan: WritePlan, ids: list[int], fill_ids=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Demote eagerly, stage, replay the bucket's graph: views ``hidden [k, D]`` and ``logits [k, V]`` (``None``
        from a staged graph and on tensor-parallel ranks after 0) of its static outputs (valid until its next
        replay). ``fill_ids``: writes device ids the host's do not hold (``ModelRunner._fill_ids``)."""
        r = self.runner
        r.demote_all(plan.demote_src, plan.demote_dst)
        key = self._staged_key(plan)
        if key in self.staged:  # NOTE: else a short bucket's graph (split-K until the key repeats, :meth:`reason`)
            self.staged.move_to_end(key)
            g = self.staged[key]
        else:
            g = self.graphs[self.capture(len(ids))]
        g.inputs.stage(plan, ids, r.pools.geo.page_size)
        if fill_ids is not None:  # with tensor parallelism, rank 0's ids (after the staging copy)
            fill_ids(g.inputs.ids)
        self.replays += 1
        hidden, logits, pair = g.replay()
        self._pair = None if pair is None else pair[:, :len(ids)]
        return hidden[:len(ids)], None if logits is None else logits[:len(ids)]

    def take_greedy(self) -> torch.Tensor | None:
        """The ``greedy_pair [2, k]`` of the last :meth:`run`'s logits, once (``None`` if it formed none or was taken)."""
        pair, self._pair = self._pair, None
        return pair

    def _capture_staged(self, key: tuple[int, int, int]) -> str | None:
        """Capture the staged graph of ``key`` (the oldest dropped beyond ``STAGED_GRAPHS``); ``staged_memory`` if the
        device has no room for it (its private pool cannot reuse the allocator's cached blocks): staged graphs
        stop, the step runs eagerly."""
        kb, bf16, int2 = key
        try:
            self.staged[key] = _Graph(self.runner, kb, self.pool, _FixedLens(self.runner.backend, ((bf16,), (int2,)), kb))
        except torch.cuda.OutOfMemoryError:
            log.warning("oscarkv: no device memory to capture a staged extend graph of %d tokens; long follow-up "
                        "steps run eagerly from now on", kb)
            self.staged_buckets, self.staged = (), OrderedDict()
            return "staged_memory"
        self.sightings.pop(key, None)
        while len(self.staged) > STAGED_GRAPHS:
            self.staged.popitem(last=False)
        return None

    def capture(self, tokens: int) -> int:
        """Build (on CUDA: capture) the graph of ``tokens``' bucket unless it exists; the bucket. Capturing writes
        only the scratch page (the static inputs start as padding rows), so it may run at any time between steps."""
        kb = self.bucket(tokens)
        if kb not in self.graphs:
            self.graphs[kb] = _Graph(self.runner, kb, self.pool, greedy=self.greedy)
        return kb


def _prefers_splitk(k: int, plan: WritePlan, page: int) -> bool:
    """``chunk_splitk.prefers_splitk`` of a chunk of ``k`` tokens over the prefix of ``plan`` (the eager route)."""
    from oscarkv.kernels.chunk_splitk import prefers_splitk

    int2 = len(plan.view_int2) * page
    return prefers_splitk(k, plan.view_bf16_len + int2, int2 > 0)
