"""The all-reduce of the row-parallel projections (``o_proj``, ``down_proj``): one small interface, two kinds.

Role: :class:`AllReduce` sums a tensor over the ranks of a tensor-parallel group through the group's own
backend (NCCL on CUDA, gloo on the CPU). :class:`SymmMemAllReduce` sums small messages (decode steps:
``[B, D]`` bf16, 8 KB at batch 1 of an 8B model) through peer-to-peer symmetric memory
(``torch.distributed._symmetric_memory``): every rank copies its partial sum into its buffer, a barrier on
signal pads, then each rank reads the peers' buffers and sums (``one_shot``), or each sums a 1/n slice and
the slices are gathered (``two_shot``) — one kernel launch, no NCCL proxy, capturable in a CUDA graph.
Messages larger than its buffer (prefill chunks) go through NCCL. NOTE: NVLink multicast (the ``multimem``
operations) is never used: it stays off on the hosts we share.

Which kind a group uses is :data:`ALL_REDUCE_KINDS` (``EngineConfig.tensor_parallel_all_reduce``):
``auto`` picks a symmetric-memory kind only where :data:`SYMM_MEM_WINS` lists the number of ranks (a table
measured by ``lab/scripts/gpu_tp_speed.sh``), else NCCL. :func:`make_all_reduce` builds it, on every rank
at once (the symmetric buffer's rendezvous is a collective).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from oscarkv.config.serving import TP_ALL_REDUCES

log = logging.getLogger(__name__)

ALL_REDUCE_KINDS = TP_ALL_REDUCES
"""``auto``: :data:`SYMM_MEM_WINS`, else ``nccl``; ``nccl``: the group's backend (gloo on the CPU);
``one_shot`` / ``two_shot``: symmetric memory for messages up to the buffer (CUDA only)."""
SYMM_MEM_WINS: dict[int, str] = {}
"""Ranks -> the symmetric-memory kind that beat NCCL inside a decode CUDA graph at every decode message size
(``lab/scripts/gpu_tp_speed.sh``). NOTE: empty until that script has run on a multi-GPU host: ``auto``
means NCCL until a measurement says otherwise."""
SYMM_MEM_OPS = {"one_shot": "one_shot_all_reduce_copy_out", "two_shot": "two_shot_all_reduce_out"}
"""The ``torch.ops.symm_mem`` operator of each kind (checked at start-up: torch >= 2.7 has both)."""


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

    def __init__(self, group, kind: str, device: torch.device, dtype: torch.dtype, max_numel: int) -> None:
        super().__init__(group)
        symm = _symm_mem(kind)
        self.kind, self.dtype, self.max_numel = kind, dtype, max_numel
        self.op = getattr(torch.ops.symm_mem, SYMM_MEM_OPS[kind])
        self.group_name = group.group_name
        self.buffer = symm.empty(max_numel, dtype=dtype, device=device)
        symm.rendezvous(self.buffer, self.group_name)  # NOTE: a collective: every rank builds its own at once

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        if n > self.max_numel or x.dtype != self.dtype or not x.is_contiguous():
            return super().__call__(x)
        staged, out = self.buffer[:n].view_as(x), torch.empty_like(x)
        if self.kind == "one_shot":  # the kernel copies x into this rank's buffer itself
            return self.op(staged, x, "sum", self.group_name, out)
        staged.copy_(x)
        return self.op(staged, "sum", self.group_name, out)


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


def choose(kind: str, size: int, device: torch.device) -> str:
    """The kind a group of ``size`` ranks on ``device`` uses for ``kind`` (see :data:`ALL_REDUCE_KINDS`)."""
    if kind not in ALL_REDUCE_KINDS:
        raise ValueError(f"all-reduce kind must be one of {ALL_REDUCE_KINDS}, got {kind!r}")
    if kind == "auto":
        best = SYMM_MEM_WINS.get(size, "nccl") if device.type == "cuda" else "nccl"
        return best if best == "nccl" or hasattr(torch.ops.symm_mem, SYMM_MEM_OPS[best]) else "nccl"
    if kind != "nccl" and device.type != "cuda":
        raise ValueError(f"all-reduce {kind!r} needs CUDA (symmetric memory); on {device.type} use 'nccl' or 'auto'")
    if kind == "two_shot" and size not in (2, 4, 8):
        raise ValueError(f"all-reduce 'two_shot' runs on 2, 4 or 8 ranks (torch's kernel), not {size}")
    return kind


def make_all_reduce(kind: str, group, device: torch.device, dtype: torch.dtype, max_numel: int) -> AllReduce:
    """The all-reduce of ``group`` (call on every rank at once); ``max_numel``: the largest message the
    symmetric kinds serve (a decode step's ``[B, D]`` at the largest graph bucket)."""
    chosen = choose(kind, dist.get_world_size(group), device)
    if chosen == "nccl":
        return AllReduce(group)
    log.info("tensor-parallel all-reduce: %s up to %d elements, NCCL above", chosen, max_numel)
    return SymmMemAllReduce(group, chosen, device, dtype, max_numel)
