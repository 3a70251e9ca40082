"""Weight prefetch into L2 while a decode step's latency-bound work runs (``EngineConfig.l2_prefetch``).

Role: at batch 1 the GEMVs of small projections run at 60–80% of the copy rate, while attention over few KV
heads, tensor parallelism's all-reduces and the norms leave the memory system idle (docs/BENCHMARKS.md).
:func:`attach` gives a projection the first bytes of the next one's weight (``l2_next``, a uint8 view);
:func:`after_gemv` issues their prefetch (:mod:`oscarkv.kernels.prefetch`) right after the projection's
GEMV — a row-parallel projection (:class:`~oscarkv.models.parallel.RowParallelLinear`) before its all-reduce —
so they stream into L2 during the work in between and the next GEMV reads them from there. On CUDA the prefetch
launches on a side stream forked from the current one (a prefetch kernel lasts until its bulk copies drain: in
line it delayed every kernel after it, 2026-11-28), and :func:`join` (the end of the model's forward) joins it. The points:
``attn`` qkv → o_proj (attention), ``reduce`` o_proj → gate_up (all-reduce, residual norm), ``act``
gate_up → down_proj (SiLU·mul), ``next`` down_proj → the next layer's qkv (all-reduce, norm). A prefetch
writes nothing: outputs are those without it. Inside a CUDA graph the launches are captured like any other.
"""

from __future__ import annotations

import torch
from torch import nn


def flat_view(weight: torch.Tensor, budget: int) -> torch.Tensor:
    """The first ``min(budget, bytes)`` bytes of a contiguous ``weight`` as uint8, rounded down to 16 (a view)."""
    assert weight.is_contiguous() and weight.data_ptr() % 16 == 0, "prefetch needs a contiguous, 16-byte aligned weight"
    flat = weight.reshape(-1).view(torch.uint8)
    return flat[: min(budget, flat.numel()) // 16 * 16]


def after_gemv(linear: nn.Module) -> None:
    """Issue the prefetch :func:`attach` gave ``linear`` (none: nothing). Modules that reduce their own output
    (``issues_own_prefetch``) issue it themselves, between the GEMV and the reduction; calls from outside skip them."""
    if not getattr(linear, "issues_own_prefetch", False):
        issue(linear)


_side: dict[int, torch.cuda.Stream] = {}
"""Per CUDA device: the side stream prefetches run on."""
_forked: set[int] = set()
"""Devices whose side stream holds prefetches the current stream has not joined yet."""


def issue(linear: nn.Module) -> None:
    t = linear.__dict__.get("l2_next")
    if t is None:
        return
    from oscarkv.kernels.prefetch import l2_prefetch

    if not t.is_cuda:
        l2_prefetch(t)
        return
    dev = t.device.index
    side = _side.get(dev)
    if side is None:
        side = _side[dev] = torch.cuda.Stream(t.device)
    side.wait_stream(torch.cuda.current_stream(t.device))  # after the GEMV's inputs, like the GEMV
    with torch.cuda.stream(side):
        l2_prefetch(t)
    _forked.add(dev)


def join(device: torch.device) -> None:
    """The current stream waits for the prefetches forked since the last join (a CUDA graph's capture must join
    every stream it forked); nothing when none were."""
    if device.type == "cuda" and device.index in _forked:
        torch.cuda.current_stream(device).wait_stream(_side[device.index])
        _forked.discard(device.index)


def attach(layers: nn.ModuleList, points: tuple[str, ...], budget: int) -> int:
    """Attach the prefetches of ``points`` (``oscarkv.config.L2_PREFETCH_POINTS``), ``budget`` bytes each, to the
    projections of ``layers`` (dense decoder layers: ``self_attn.qkv_proj/o_proj``, ``mlp.gate_up_proj/down_proj``;
    other layers are skipped), after removing any attached before. Nothing is attached where the kernel cannot
    run (``kernels.prefetch.supported``). Returns the bytes one decode step prefetches."""
    for layer in layers:
        for m in _projections(layer):
            m.__dict__.pop("l2_next", None)
    if not points or not layers or not _supported(next(layers[0].parameters()).device):
        return 0
    total = 0
    for i, layer in enumerate(layers):
        proj = _projections(layer)
        if len(proj) < 4:
            continue
        qkv, o, gate_up, down = proj
        nxt = getattr(getattr(layers[i + 1], "self_attn", None), "qkv_proj", None) if i + 1 < len(layers) else None
        pairs = {"attn": (qkv, o), "reduce": (o, gate_up), "act": (gate_up, down),
                 "next": (down, nxt) if nxt is not None else None}
        for p in points:
            if pairs[p] is not None:
                src, dst = pairs[p]
                src.l2_next = flat_view(dst.weight, budget)
                total += src.l2_next.numel()
    return total


def _supported(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    from oscarkv.kernels.prefetch import supported

    return supported(device)


def _projections(layer: nn.Module) -> list[nn.Module]:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    found = [getattr(attn, "qkv_proj", None), getattr(attn, "o_proj", None),
             getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None)]
    return [m for m in found if m is not None]
