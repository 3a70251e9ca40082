"""Attention of a short chunk over a long cached prefix: the split-K kernel against the tile and staged paths.

``python -m lab.benchmarks.chunk_attention OUT.json [K,K,...]`` (needs CUDA). One sequence, Qwen3-4B/8B attention shape
(both: 32 query heads, 8 KV heads, head_dim 128; page 64, sink 64, recent 256, G = 128), a cached prefix of 32K
or 100K tokens (BF16-only or INT2) and a chunk of k = 1, 8, 64, 512 new tokens. Per shape, milliseconds per
layer on the GPU (``_ms``: calls replayed from a CUDA graph, as the engine's extend graphs run them; the INT2 32K
cache fits the L2, the others do not):

* ``splitk`` — :func:`oscarkv.kernels.chunk_splitk.chunk_attention` at its table; ``splitk_rows=R`` other row tiles;
* ``tile`` — :func:`oscarkv.kernels.extend.extend_attention` (today's path for k < 64);
* ``staged`` — :func:`oscarkv.kernels.prefill.prefill_attention` (today's path for k >= 64);
* ``routed`` — ``TritonAttention.extend``, what the engine runs (the table of ``chunk_splitk.SPLITK_SHAPES``);
* ``decode`` — one decode step over the same cache (:func:`oscarkv.kernels.decode.decode_attention`);
* ``err_splitk`` — ‖splitk − staged‖ / ‖staged‖ (both against the same stored cache).

Each shape is guarded: a failure is recorded in the JSON and the next shape runs. Prints a table.
"""

from __future__ import annotations

import json
import statistics
import sys
import traceback

import torch

CONTEXTS = (32768, 102400)
CHUNKS = (1, 8, 64, 512)
HQ, H, D = 32, 8, 128
ROWS = (16, 32, 64)


def _ms(fn, reps: int = 10) -> float:
    """Milliseconds of one ``fn()`` on the GPU alone (``variants_common.graph_us``: ``reps`` calls replayed from one
    CUDA graph; an eager call of a few Triton launches costs ~0.2 ms of host time, which had hidden the kernels'
    differences below it). A call that cannot be captured (a host sync) is timed eagerly: median of ``reps``
    CUDA-event timings, host time included; :data:`EAGER` names those."""
    from lab.benchmarks.variants_common import graph_us

    try:
        return graph_us([fn], reps) / 1e3
    except Exception:  # NOTE: e.g. a path that reads a tensor on the host; the capture is abandoned
        torch.cuda.synchronize()
        EAGER.add(getattr(fn, "__name__", repr(fn)))
        return _eager_ms(fn, reps)


EAGER: set[str] = set()
"""Functions :func:`_ms` timed eagerly (their capture failed)."""


def _eager_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _shape(kv, tables, k: int) -> dict:
    """Every path's time at one chunk length over the cache ``kv, tables``."""
    from oscarkv.attention.backends import TritonAttention
    from oscarkv.kernels.chunk_splitk import chunk_attention
    from oscarkv.kernels.decode import decode_attention
    from oscarkv.kernels.extend import extend_attention
    from oscarkv.kernels.prefill import prefill_attention

    gen = torch.Generator(device="cuda").manual_seed(k)
    q, kn, vn = (torch.randn(k, n, D, generator=gen, device="cuda").bfloat16() for n in (HQ, H, H))
    cu, scale, lens = torch.tensor([0, k], dtype=torch.int32, device="cuda"), D**-0.5, tables.lens()
    paths = {
        "splitk": lambda: chunk_attention(q, kn, vn, kv, tables, cu, scale, k),
        "tile": lambda: extend_attention(q, kn, vn, kv, tables, cu, scale, max_chunk=k),
        "staged": lambda: prefill_attention(q, kn, vn, kv, tables, 0, (lens[0][0], lens[1][0]), scale),
        "routed": lambda: TritonAttention().extend(q, kn, vn, kv, tables, cu, scale, cu_host=(0, k)),
        "decode": lambda: decode_attention(q[:1], kv, tables, scale),
    }
    for r in ROWS:
        if r <= max(8, 4 * k):
            paths[f"splitk_rows={r}"] = lambda r=r: chunk_attention(q, kn, vn, kv, tables, cu, scale, k,
                                                                    config=dict(ROWS=r))
    row = {}
    for name, fn in paths.items():
        try:
            row[name] = round(_ms(fn, 5 if name in ("tile", "staged") and k >= 64 else 10), 4)
        except Exception as e:  # NOTE: one path failing must not lose the others
            row[name] = f"error: {type(e).__name__}: {e}"[:300]
    try:
        ref = paths["staged"]().float()
        row["err_splitk"] = float((paths["splitk"]().float() - ref).norm() / ref.norm())
    except Exception as e:
        row["err_splitk"] = f"error: {type(e).__name__}: {e}"[:300]
    return row


def main(path: str, chunks: tuple[int, ...] = CHUNKS) -> None:
    from oscarkv.kernels.synthetic import random_cache

    results = dict(device=torch.cuda.get_device_name(), shape=dict(q_heads=HQ, kv_heads=H, head_dim=D), rows=[])
    print(f"{'ctx':>7} {'kv':>5} {'k':>4} {'splitk':>8} {'tile':>8} {'staged':>8} {'routed':>8} {'decode':>8}  ms/layer")
    for ctx in CONTEXTS:
        for int2 in (False, True):
            try:
                kv, tables = random_cache([ctx], H, D, page=64, group=128, sink=64, recent=256, int2=int2,
                                          device="cuda", shuffle=False)
            except Exception:
                results["rows"].append(dict(ctx=ctx, int2=int2, error=traceback.format_exc()[-500:]))
                continue
            for k in chunks:
                try:
                    row = dict(ctx=ctx, kv="int2" if int2 else "bf16", k=k, **_shape(kv, tables, k))
                except Exception:
                    row = dict(ctx=ctx, kv="int2" if int2 else "bf16", k=k, error=traceback.format_exc()[-500:])
                results["rows"].append(row)
                cells = " ".join(f"{row.get(n, '-'):>8}" if not isinstance(row.get(n), float) else f"{row[n]:8.3f}"
                                 for n in ("splitk", "tile", "staged", "routed", "decode"))
                print(f"{ctx:>7} {row['kv']:>5} {k:>4} {cells}", flush=True)
                with open(path, "w") as f:
                    json.dump(results, f, indent=1)
            del kv, tables
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], tuple(map(int, sys.argv[2].split(","))) if len(sys.argv) > 2 else CHUNKS)
