"""One-shot all-reduce fused with the residual add and RMSNorm, over peer-to-peer symmetric memory.

Role: a tensor-parallel decode step ends each row-parallel projection (``o_proj``, ``down_proj``) with an all-reduce
of a ``[B, D]`` bf16 message (8 KB at batch 1 of an 8B model), then adds the residual and normalizes
(:func:`oscarkv.kernels.fused.rms_norm`): two launches and an extra pass, 72 times a step. Here one launch does
all of it (:func:`all_reduce_rms_norm`), for the all-reduce kind ``one_shot_norm`` (:mod:`oscarkv.models.parallel`:
``ReducingRMSNorm``; DESIGN.md §8). Two H200s (``lab/scripts/tp_ar_norm_check.py``, 2026-11-28): every rank's bits
equal, 5.6 µs a call at one row against 8.2 for the one-shot all-reduce plus ``rms_norm``.

One program per row (decode messages: a few rows), each rank running the same kernel at once; program ``t``:

    copy row t of this rank's partial into its buffer's slot ``parity[t]``      (its own symmetric buffer)
    CTA barrier; arrive: on every peer's signal pad, flag ``t·world + rank`` 0 → 1   (compare-and-swap, release, sys)
    wait: on its own pad, every peer's flag ``t·world + q`` 1 → 0                    (compare-and-swap, acquire, sys)
    CTA barrier; Σ_ranks row t (rank order, fp32) → bf16 → + residual → RMSNorm   (``rms_norm``'s arithmetic)
    parity[t] ← 1 − parity[t]

Why two slots and no epoch: a rank writes row ``t`` of slot ``s`` only after every peer arrived for row ``t`` the
last time it was used (so no peer still reads row ``t`` of slot ``s`` from the use before that); the flags are
consumed by the waiter (1 → 0) and set only from 0, so they need no counter either. Rows are independent, so each
has its own parity and flags, and a call of fewer rows leaves the others' state as it was on every rank alike.
Nothing on the host changes between calls: a CUDA graph replays it. (One program for all rows was 5× slower at 8
rows: ``lab/record/benchmarks-log.md``, thirteenth session.)

Every rank sums in rank order, so every rank holds the same bits (the residual stream stays identical across ranks).
The sum is rounded to bf16 before the residual add, as the all-reduce's output is, so the result is
:func:`oscarkv.kernels.fused.rms_norm` of ``Σ partials`` rounded (fp32 sum in rank order).

Memory layout: ``x``, ``residual``, outputs ``[rows, D]`` bf16, rows contiguous; each rank's buffer holds two
slots of ``slot_elems`` elements (row ``t`` at ``t·D``); ``buf_ptrs``/``pad_ptrs`` are int64 device arrays of the
ranks' buffer and signal-pad addresses (built from ``torch`` symmetric memory's ``buffer_ptrs`` /
``signal_pad_ptrs``; in the CPU tests, local tensors standing for the peers). NOTE: NVLink multicast is never used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from oscarkv.kernels.fused import _norm_row


SPIN_TRIES = 1 << 22
"""Compare-and-swap tries before a wait gives up on a peer (seconds on a GPU): a dead worker must not leave a
kernel spinning forever (it would outlive the engine and block the device)."""


@dataclass(frozen=True)
class PeerBuffers:
    """One rank's view of the symmetric buffers: addresses of every rank's buffer and signal pad (int64 device
    arrays, ``[world]``), the device-side slot parity of each row (int32 ``[rows a slot holds]``, zeros at first),
    whether a peer stopped answering (int32 ``[1]``, 0 at first), this rank, the ranks and a slot's size; ``memory``: what
    keeps the addresses mapped (the symmetric tensor and its handle: freed, the kernel faults)."""

    buf_ptrs: torch.Tensor
    pad_ptrs: torch.Tensor
    parity: torch.Tensor
    failed: torch.Tensor
    rank: int
    world: int
    slot_elems: int
    memory: object = field(default=None, repr=False, compare=False)


@triton.jit
def _spin_cas(ptr, cmp, val, SEM: tl.constexpr, SPIN: tl.constexpr):
    """Compare-and-swap ``cmp`` → ``val`` at system scope until it succeeds or ``SPIN`` tries failed; whether it
    succeeded."""
    tries = 0
    while (tl.atomic_cas(ptr, cmp, val, sem=SEM, scope="sys") != cmp) & (tries < SPIN):
        tries += 1
    return tries < SPIN


@triton.jit
def _arrive_and_wait(pad_ptrs, flags, rank, Failed, WORLD: tl.constexpr, SPIN: tl.constexpr):
    """Flag ``flags + rank`` on every peer's pad (0 → 1, release), then consume every peer's flag ``flags + q`` on
    this rank's pad (1 → 0, acquire); system scope: the peers are other GPUs. A peer that does not answer within
    ``SPIN`` tries (a dead worker) sets ``Failed``; from then on no call waits (the engine's watcher fails it)."""
    ok = tl.load(Failed) == 0
    for p in tl.static_range(WORLD):
        if p != rank:
            if ok:
                pad = tl.load(pad_ptrs + p).to(tl.pointer_type(tl.int32)) + flags
                ok = _spin_cas(pad + rank, 0, 1, "release", SPIN)
    own = tl.load(pad_ptrs + rank).to(tl.pointer_type(tl.int32)) + flags
    for q in tl.static_range(WORLD):
        if q != rank:
            if ok:
                ok = _spin_cas(own + q, 1, 0, "acquire", SPIN)
    if not ok:
        tl.store(Failed, 1)


@triton.jit
def _ar_rms_norm_kernel(peers, x_rows, res_rows, W, out_rows, eps, N, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                        SPIN: tl.constexpr):
    """Program ``t``: row ``t``. ``peers = (buffer addresses, pad addresses, parities, failed, slot elements,
    rank)``
    (:class:`PeerBuffers`); ``x_rows = (x, row stride)``; ``res_rows = (residual in, residual out, row stride)``;
    ``out_rows = (out, row stride)``."""
    buf_ptrs, pad_ptrs, Parity, Failed, slot_elems, rank = peers  # NOTE: one level per statement (Triton 3.6)
    X, sx = x_rows
    R, RO, sr = res_rows
    Out, so = out_rows
    t = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    slot = tl.load(Parity + t)
    at = slot * slot_elems + t * N
    own = tl.load(buf_ptrs + rank).to(tl.pointer_type(tl.bfloat16)) + at
    tl.store(own + cols, tl.load(X + t * sx + cols, mask=mask, other=0.0), mask=mask)
    tl.debug_barrier()
    _arrive_and_wait(pad_ptrs, t * WORLD, rank, Failed, WORLD, SPIN)
    tl.debug_barrier()
    acc = tl.zeros([BLOCK], tl.float32)
    for p in tl.static_range(WORLD):
        peer = tl.load(buf_ptrs + p).to(tl.pointer_type(tl.bfloat16)) + at
        acc += tl.load(peer + cols, mask=mask, other=0.0, volatile=True).to(tl.float32)  # no L1 copy
    x = (acc.to(tl.bfloat16).to(tl.float32) + tl.load(R + t * sr + cols, mask=mask, other=0.0).to(tl.float32))
    x = x.to(tl.bfloat16)
    tl.store(RO + t * sr + cols, x, mask=mask)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + t * so + cols, _norm_row(x, w, N, eps).to(tl.bfloat16), mask=mask)
    tl.store(Parity + t, 1 - slot)


def all_reduce_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        peers: PeerBuffers) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's partial ``x [rows, D]`` summed over the ranks, plus ``residual``, normalized → ``(RMSNorm(sum),
    sum)`` as :func:`oscarkv.kernels.fused.rms_norm` of the all-reduced ``x`` gives them. Every rank calls it at
    once with its own ``peers`` (see the module docstring)."""
    rows, n = x.shape
    assert x.dtype == residual.dtype == torch.bfloat16 and residual.shape == x.shape and weight.shape == (n,), \
        f"bad x {tuple(x.shape)} {x.dtype} / residual {tuple(residual.shape)} {residual.dtype} / weight {tuple(weight.shape)}"
    assert x.stride(1) == 1 and residual.is_contiguous() and rows * n <= peers.slot_elems and rows <= len(peers.parity), \
        f"x's rows contiguous, the residual dense, and a slot holds them ({rows} x {n}, {peers.slot_elems})"
    out, res = torch.empty_like(x), torch.empty_like(residual)
    _ar_rms_norm_kernel[(rows,)]((peers.buf_ptrs, peers.pad_ptrs, peers.parity, peers.failed, peers.slot_elems,
                                  peers.rank),
                              (x, x.stride(0)), (residual, res, residual.stride(0)), weight, (out, out.stride(0)), eps,
                              n, WORLD=peers.world, BLOCK=triton.next_power_of_2(n), SPIN=SPIN_TRIES,
                                 num_warps=8 if n > 4096 else 4)
    return out, res
