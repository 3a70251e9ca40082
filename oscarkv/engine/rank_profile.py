"""Per-kernel GPU time of a callable on one rank: the profile a benchmark prints, on every tensor-parallel rank.

Role: :func:`kernel_profile` runs ``torch.profiler`` over a few calls (a decode graph's replay, or whole
engine steps) and returns the most expensive kernels. ``oscarkv bench decode --profile`` calls it on rank 0;
with tensor parallelism ``ParallelRunner.profile`` has every worker run it at the same time over its own
graph (a rank's graph replays only with the others') and print its rows as one JSON line tagged with its
rank, so where each rank's time goes — its attention, its GEMMs, the all-reduce kernels and their waits for
the slowest peer — can be read side by side.
"""

from __future__ import annotations

import cProfile
import json
import pstats
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


def host_rows(prof: cProfile.Profile, top: int = 14) -> list[dict]:
    """The ``top`` functions of a finished cProfile by own time: name and µs (cProfile roughly doubles Python's
    cost, so read the shares, not the sums)."""
    st = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    rows = sorted(((v[2], k) for k, v in st.items()), reverse=True)[:top]
    return [dict(name=f"{k[0].rsplit('/', 1)[-1]}:{k[1]}({k[2]})", us=1e6 * t) for t, k in rows]


def runtime_profiler():
    """A started ``torch.profiler`` of host operators only (aten ops, CUDA runtime calls, collectives; no CUPTI):
    where a host waits shows as the own time of a blocking call (``cudaStreamSynchronize``, a gloo broadcast)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    return prof


def runtime_rows(prof, top: int = 14) -> list[dict]:
    """The ``top`` host operators of a ``runtime_profiler`` (stopped here) by own time: name, µs and calls."""
    prof.stop()
    rows = [dict(name=e.key[:90], us=e.self_cpu_time_total, count=e.count) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r["us"])[:top]


OFF, FUNCTIONS, OPERATORS = 0, 1, 2
"""A worker's host-profile modes (the ``HOST_PROFILE`` message's argument): end and print; cProfile of Python
functions; ``runtime_profiler``'s host operators."""


class HostProfile:
    """A worker's host profile between ``HOST_PROFILE`` messages (:meth:`ParallelRunner.host_profile`): started
    by ``FUNCTIONS`` or ``OPERATORS``, ended by ``OFF``, which prints its rows as one JSON line tagged with the rank
    (``host`` or ``runtime``)."""

    def __init__(self, rank: int) -> None:
        self.rank, self.prof = rank, None

    def switch(self, mode: int) -> None:
        if mode != OFF and self.prof is None:
            self.prof = runtime_profiler() if mode == OPERATORS else cProfile.Profile()
            if mode == FUNCTIONS:
                self.prof.enable()
        elif mode == OFF and self.prof is not None:
            if isinstance(self.prof, cProfile.Profile):
                self.prof.disable()
                rows = dict(host=host_rows(self.prof, 20))
            else:
                rows = dict(runtime=runtime_rows(self.prof, 20))
            print(json.dumps(dict(rank=self.rank, **rows)), flush=True)
            self.prof = None
