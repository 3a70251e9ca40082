"""The all-reduce of the row-parallel projections (``o_proj``, ``down_proj``): one small interface, two kinds.

Role: :class:`AllReduce` sums a tensor over the ranks of a tensor-parallel group through the group's own
backend (NCCL on CUDA, gloo on the CPU). :class:`SymmMemAllReduce` sums small messages (decode steps:
``[B, D]`` bf16, 8 KB at batch 1 of an 8B model) through peer-to-peer symmetric memory
(``torch.distributed._symmetric_memory``): every rank copies its partial sum into its buffer, a barrier on
signal pads, then each rank reads the peers' buffers and sums (``one_shot``), or each sums a 1/n slice and
the slices are gathered (``two_shot``) — one kernel launch, no NCCL proxy, capturable in a CUDA graph.
``one_shot_norm`` is ``one_shot`` plus a second buffer (:func:`norm_peers`) through which a Llama-style model's
next norm sums messages of up to :data:`FUSED_NORM_ROWS` rows itself (``oscarkv.models.parallel.ReducingRMSNorm``).
Messages larger than its buffer (prefill chunks) go through NCCL. NOTE: NVLink multicast (the ``multimem``
operations) is never used: it stays off on the hosts we share.

Which kind a group uses is :data:`ALL_REDUCE_KINDS` (``EngineConfig.tensor_parallel_all_reduce``):
``auto`` picks a symmetric-memory kind only where :data:`SYMM_MEM_WINS` lists the number of ranks (a table
measured by ``lab/scripts/gpu_tp_full.sh``), else NCCL. Rank 0 alone decides (:func:`resolve`) and sends
the kind to the other ranks, so that no rank takes a fallback the others do not; :func:`make_all_reduce`
then builds exactly that kind, on every rank at once (the symmetric buffer's rendezvous is a collective).
Which path one message takes (:func:`symm_path`) depends only on its shape, dtype and layout, the same on
every rank.

NOTE: one symmetric-memory engine per process. Torch numbers the store keys of its rendezvous with a
counter per process (``StoreExchange::seq_id_`` of ``CUDASymmetricMemory``), never reset. An engine's worker
ranks are fresh processes (counter 0); rank 0, the engine's process, is not, once it has built one
symmetric buffer: a second engine's rank 0 then waits for keys no worker writes (the store timeout, 5
minutes; the hang of the second engine of a ``bench decode --methods bf16,oscar`` run and of the second
symmetric-memory GPU test, two H200s, 2026-11-27). :func:`resolve` refuses it (``auto``: NCCL).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from oscarkv.config.serving import TP_ALL_REDUCES

if TYPE_CHECKING:
    from oscarkv.kernels.allreduce_norm import PeerBuffers

log = logging.getLogger(__name__)

ALL_REDUCE_KINDS = TP_ALL_REDUCES
"""``auto``: :data:`SYMM_MEM_WINS`, else ``nccl``; ``nccl``: the group's backend (gloo on the CPU);
``one_shot`` / ``two_shot``: symmetric memory for messages up to the buffer (CUDA only); ``one_shot_norm``:
``one_shot``, each sum fused with the next residual add and RMSNorm where the model allows
(``oscarkv.models.parallel.ReducingRMSNorm``)."""
SYMM_MEM_WINS: dict[int, str] = {2: "one_shot_norm", 4: "one_shot_norm"}
"""Ranks -> the symmetric-memory kind measured fastest in whole decode steps. Two H200s, Qwen3-8B at 100K, batch 1
(``lab/scripts/gpu_untimed.sh tp2n``, 2026-11-28): OSCAR 4.14 ms a step with ``one_shot_norm`` against 4.35 with
``one_shot`` (NCCL 4.83 and ``one_shot`` 4.69 on 4 H200s, 2026-11-27), BF16 5.30 against 5.49. Four H200s
(``lab/scripts/gpu_tp_table.sh c e``, 2026-11-28): OSCAR 3.41-3.43 against NCCL's 3.59, BF16 3.95 against 4.13; its
4-rank GPU test (``test_tp4_one_shot_norm_gpu``) passed. Other counts: NCCL until measured."""
SYMM_MEM_OPS = {"one_shot": "one_shot_all_reduce_copy_out", "two_shot": "two_shot_all_reduce_out",
                "one_shot_norm": "one_shot_all_reduce_copy_out"}
"""The ``torch.ops.symm_mem`` operator of each kind (checked at start-up: torch >= 2.7 has both)."""
SYMM_MEM_ALIGN = 16
"""Bytes a symmetric-memory message's size must be a multiple of (torch's kernels move 16-byte vectors and
refuse sizes under 4-byte alignment; any other message goes through NCCL, on every rank alike)."""
FUSED_NORM_ROWS = 16
"""``one_shot_norm`` fuses messages of up to this many rows (a program a row): on two H200s (CUDA graphs, µs, D 4096)
it took 5.6 / 7.4 / 18.9 at 1 / 8 / 64 rows against one_shot + rms_norm's 8.2 / 8.6 / 12.7
(``lab/scripts/tp_ar_norm_check.py``, 2026-11-28); larger ones take one_shot and rms_norm."""
_rendezvous_done = [0]  # NOTE: symmetric buffers this process has rendezvoused (torch's own state is per process)


class AllReduce:
    """Sum over the ranks of ``group`` through its backend, in place."""

    kind = "nccl"

    def __init__(self, group) -> None:
        self.group = group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x


class SymmMemAllReduce(AllReduce):
    """Sum over the ranks through a symmetric buffer of ``max_numel`` elements of ``dtype`` (larger messages,
    other dtypes or strided ones: NCCL). Returns a new tensor (the graph's pool holds it under capture)."""

    def __init__(self, group, kind: str, device: torch.device, dtype: torch.dtype, max_numel: int,
                 max_rows: int = 1) -> None:
        super().__init__(group)
        symm = _symm_mem(kind)
        self.kind, self.dtype, self.max_numel = kind, dtype, max_numel
        self.op = getattr(torch.ops.symm_mem, SYMM_MEM_OPS[kind])
        self.group_name = group.group_name
        self.buffer = symm.empty(max_numel, dtype=dtype, device=device)
        symm.rendezvous(self.buffer, self.group_name)  # NOTE: a collective: every rank builds its own at once
        _rendezvous_done[0] += 1
        # one_shot_norm: the fused all-reduce + residual + RMSNorm's own buffer (TensorParallel.fuses reads it)
        self.peers = norm_peers(group, max_numel, min(max_rows, FUSED_NORM_ROWS), device) \
            if kind == "one_shot_norm" else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        if not symm_path(n, x.dtype, x.is_contiguous(), self.dtype, self.max_numel):
            return super().__call__(x)
        staged, out = self.buffer[:n].view_as(x), torch.empty_like(x)
        if self.kind != "two_shot":  # the one-shot kernel copies x into this rank's buffer itself
            return self.op(staged, x, "sum", self.group_name, out)
        staged.copy_(x)
        return self.op(staged, "sum", self.group_name, out)


def norm_peers(group, slot_elems: int, rows: int, device: torch.device) -> PeerBuffers:
    """A fresh symmetric buffer of two slots of ``slot_elems`` bf16 and its signal pads, as the fused all-reduce +
    RMSNorm of up to ``rows`` rows sees them (:mod:`oscarkv.kernels.allreduce_norm`; a collective, like every
    rendezvous). Its own buffer: torch's kernels keep their barrier flags in their buffer's pad."""
    from oscarkv.kernels.allreduce_norm import PeerBuffers

    symm = _symm_mem("one_shot")
    buf = symm.empty(2 * slot_elems, dtype=torch.bfloat16, device=device)
    h = symm.rendezvous(buf, group.group_name)
    _rendezvous_done[0] += 1
    if rows * h.world_size * 4 > h.signal_pad_size:
        raise RuntimeError(f"all-reduce 'one_shot_norm': {rows} rows x {h.world_size} ranks of flags exceed the "
                           f"{h.signal_pad_size}-byte signal pad; use fewer graph buckets or 'one_shot'")
    table = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731 (addresses, this process)
    flags = torch.zeros(rows + 1, dtype=torch.int32, device=device)  # each row's slot parity; a peer stopped answering
    return PeerBuffers(table(h.buffer_ptrs), table(h.signal_pad_ptrs), flags[:rows], flags[rows:], h.rank, h.world_size,
                       slot_elems, memory=(buf, h))


def symm_path(numel: int, dtype: torch.dtype, contiguous: bool, buffer_dtype: torch.dtype, max_numel: int) -> bool:
    """Whether a message of ``numel`` elements goes through the symmetric buffer (else NCCL): it fits, has the
    buffer's dtype, is contiguous and a multiple of :data:`SYMM_MEM_ALIGN` bytes. NOTE: a function of the
    message alone, so every rank takes the same path for the same message (a rank alone on NCCL would hang)."""
    return 0 < numel <= max_numel and dtype == buffer_dtype and contiguous and numel * dtype.itemsize % SYMM_MEM_ALIGN == 0


def _symm_mem(kind: str):
    """``torch.distributed._symmetric_memory``, on its peer-to-peer (CUDA) backend; raise naming what is missing."""
    import torch.distributed._symmetric_memory as symm

    if not hasattr(torch.ops.symm_mem, SYMM_MEM_OPS[kind]):
        raise RuntimeError(f"all-reduce {kind!r}: torch {torch.__version__} has no torch.ops.symm_mem."
                           f"{SYMM_MEM_OPS[kind]}; use 'nccl'")
    if hasattr(symm, "set_backend"):
        try:
            symm.set_backend("CUDA")  # NOTE: cuMem peer-to-peer buffers, not NVSHMEM
        except RuntimeError as e:  # set once per process already, or no such backend in this torch
            log.warning("symmetric memory: keeping backend %s (%s)", symm.get_backend(torch.device("cuda")), e)
    return symm


def choose(kind: str, size: int, device: torch.device, rendezvoused: bool = False) -> str:
    """The kind a group of ``size`` ranks on ``device`` uses for ``kind`` (see :data:`ALL_REDUCE_KINDS`);
    ``rendezvoused``: this process has built a symmetric buffer for an earlier group (see the module NOTE)."""
    if kind not in ALL_REDUCE_KINDS:
        raise ValueError(f"all-reduce kind must be one of {ALL_REDUCE_KINDS}, got {kind!r}")
    if kind == "auto":
        best = SYMM_MEM_WINS.get(size, "nccl") if device.type == "cuda" else "nccl"
        if best != "nccl" and rendezvoused:
            log.warning("all-reduce auto: NCCL, not %s (this process built a symmetric buffer for an earlier "
                        "engine; torch's rendezvous would wait for the new workers forever)", best)
            return "nccl"
        return best if best == "nccl" or hasattr(torch.ops.symm_mem, SYMM_MEM_OPS[best]) else "nccl"
    if kind != "nccl" and device.type != "cuda":
        raise ValueError(f"all-reduce {kind!r} needs CUDA (symmetric memory); on {device.type} use 'nccl' or 'auto'")
    if kind == "two_shot" and size not in (2, 4, 8):
        raise ValueError(f"all-reduce 'two_shot' runs on 2, 4 or 8 ranks (torch's kernel), not {size}")
    if kind != "nccl" and rendezvoused:
        raise RuntimeError(f"all-reduce {kind!r}: this process already built a symmetric-memory buffer for an "
                           "earlier tensor-parallel engine, and torch numbers its rendezvous per process, so the new "
                           "workers would never meet rank 0; run each such engine in its own process, or use 'nccl'")
    return kind


def resolve(kind: str, size: int, device: torch.device) -> str:
    """Rank 0: the kind its engine's ranks build (:func:`choose` in this process's state); the others receive it."""
    return choose(kind, size, device, rendezvoused=_rendezvous_done[0] > 0)


def make_all_reduce(kind: str, group, device: torch.device, dtype: torch.dtype, max_numel: int,
                    max_rows: int = 1) -> AllReduce:
    """The all-reduce of ``group`` (call on every rank at once, with the same ``kind``: an engine's is rank 0's
    :func:`resolve`); ``max_numel``: the largest message the symmetric kinds serve (a decode step's ``[B, D]``
    at the largest graph bucket, ``max_rows`` rows)."""
    chosen = choose(kind, dist.get_world_size(group), device)
    if chosen == "nccl":
        return AllReduce(group)
    log.info("tensor-parallel all-reduce: %s up to %d elements, NCCL above", chosen, max_numel)
    return SymmMemAllReduce(group, chosen, device, dtype, max_numel, max_rows)
