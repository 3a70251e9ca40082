"""What every decode-kernel variant bench shares: CUDA-graph timing, synthetic caches, the oracle check.

Role: :func:`graph_us` times one call as CUDA-graph replays over several caches (the engine
replays CUDA graphs too, and graphs remove the Python launch overhead that dominates eager
timings at batch 1); :func:`random_caches` builds the ``n`` distinct paged caches it rotates
over — ``n`` is chosen by the callers so that they exceed the L2 cache (:data:`L2_BYTES`) and
every replay reads from HBM; :func:`rel_err` is ‖out − ref‖/‖ref‖ against the fp32 oracle
(:func:`oscarkv.kernels.reference.decode_attention_ref`). Used by ``variants_int2``,
``variants_bf16``, ``variants_round6`` and ``lab.benchmarks.bf16_peer``.
"""

from __future__ import annotations

import torch

L2_BYTES = 50 * 2**20
"""L2 cache of an H100 (50 MB): the rotated caches of one timing total at least four times this."""


def graph_us(fns: list, reps: int = 10) -> float:
    """Median time of one call, replaying a CUDA graph that calls every ``fns`` in turn ``reps`` times."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for f in fns:
                f()
    g.replay()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / (reps * len(fns)))
    del g
    return sorted(times)[len(times) // 2]


def random_caches(cfg, ctx, bsz, int2, group, n):
    """``n`` random paged caches of ``bsz`` sequences of ``ctx`` tokens each (distinct seeds)."""
    from oscarkv.kernels.synthetic import random_cache

    return [random_cache([ctx] * bsz, cfg.kv_heads, cfg.head_dim, page=cfg.page_size, group=group, sink=cfg.sink,
                         recent=cfg.recent, int2=int2, device="cuda", seed=ctx + bsz + i) for i in range(n)]


def rel_err(q, kv, tables, out, scale):
    """‖out − ref‖/‖ref‖ against the fp32 oracle on the same cache."""
    from oscarkv.kernels.reference import decode_attention_ref

    ref = decode_attention_ref(q.float(), kv, tables, scale)
    return ((out.float() - ref).norm() / ref.norm()).item()
