"""Per-kernel GPU time of a callable on one rank: the profile a benchmark prints, on every tensor-parallel rank.

Role: :func:`kernel_profile` runs ``torch.profiler`` over a few calls (a decode graph's replay, or whole
engine steps) and returns the most expensive kernels. ``oscarkv bench decode --profile`` calls it on rank 0;
with tensor parallelism ``ParallelRunner.profile`` has every worker run it at the same time over its own
graph (a rank's graph replays only with the others') and print its rows as one JSON line tagged with its
rank, so where each rank's time goes — its attention, its GEMMs, the all-reduce kernels and their waits for
the slowest peer — can be read side by side.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def kernel_profile(step: Callable[[], object], reps: int = 5, top: int = 14) -> list[dict]:
    """Per-kernel GPU time of one call of ``step`` (``torch.profiler`` over ``reps`` calls after one untimed
    call): name, µs per call and launches per call, the ``top`` most expensive names, then the rest summed."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    rows = [dict(name=e.key[:90], us=getattr(e, "device_time_total", 0.0) / reps, count=e.count / reps)
            for e in prof.key_averages() if getattr(e, "device_time_total", 0.0) > 0]
    rows.sort(key=lambda r: -r["us"])
    rest = rows[top:]
    return rows[:top] + ([dict(name="(other kernels)", us=sum(r["us"] for r in rest),
                               count=sum(r["count"] for r in rest))] if rest else [])
