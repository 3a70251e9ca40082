"""A Triton kernel that hints L2 to load a byte range (Hopper's ``cp.async.bulk.prefetch.L2``).

Role: :mod:`oscarkv.models.prefetch` issues it for the next projection's weights while a decode step's
latency-bound work runs. Each of 32 lanes per program issues one bulk prefetch of up to 16 KiB (16-byte
aligned, a multiple of 16 bytes): 512 KiB a program, so 24 MiB spread over 48 SMs' copy engines (three programs of
128 × 64 KiB cost ~34 µs a point in line on an H200, 2026-11-28, about 24 MiB at a few SMs' copy rate: the launch
seemingly lasts until its copies drain, hence also the side stream of :mod:`oscarkv.models.prefetch`). The
instruction writes nothing, so numerics never change. CUDA on compute capability 9.0 or later only (:func:`supported`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK, LANES = 1 << 14, 32


@triton.jit
def _l2_prefetch_kernel(base, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    offs = lane.to(tl.int64) * CHUNK
    size = (tl.minimum(nbytes - offs, CHUNK) // 16 * 16).to(tl.int32)  # <= 0 past the end: no prefetch
    tl.inline_asm_elementwise(
        asm="{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        constraints="=r,l,r", args=[base + offs, size], dtype=tl.int32, is_pure=False, pack=1)


def supported(device: torch.device) -> bool:
    """Whether :func:`l2_prefetch` runs on ``device`` (CUDA, compute capability >= 9.0)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def l2_prefetch(t: torch.Tensor) -> None:
    """Hint L2 to load the bytes of ``t``: a contiguous uint8 tensor on a :func:`supported` device, 16-byte aligned."""
    n = t.numel()
    if n:
        _l2_prefetch_kernel[(triton.cdiv(n, CHUNK * LANES),)](t, n, CHUNK=CHUNK, LANES=LANES, num_warps=LANES // 32)
