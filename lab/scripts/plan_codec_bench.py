"""Host cost of sending a step's write plans to the tensor-parallel ranks: pickle against the flat codec.

Run: ``python -m lab.scripts.plan_codec_bench`` (CPU, a few seconds). Decode steps at ``--context`` tokens
(page size ``--page-size``; sink 64, recent 256 as ``oscarkv bench decode``) for 1 and 32 sequences: bytes
on the wire and µs per step on the host for (pickle: ``pickle.dumps`` on rank 0 + ``pickle.loads`` on a
rank, what ``broadcast_object_list`` does besides its two collectives) and (codec: encode + decode, the
steady state where every row's INT2 view grew by at most a page, and the first step that sends every view
whole). The collectives themselves are timed by ``lab/scripts/tp_comm_bench.py`` on the GPU host.
"""

from __future__ import annotations

import argparse
import pickle
import time

from oscarkv.cache.manager import WritePlan
from oscarkv.engine.step_plan_codec import PlanDecoder, PlanEncoder


def decode_plans(batch: int, context: int, page: int, step: int) -> list[WritePlan]:
    """One decode step of ``batch`` sequences at ``context + step`` tokens (page ids distinct per sequence)."""
    plans = []
    for b in range(batch):
        t = context + step
        n_int2 = (t - 64 - 256) // page
        base = b * (t // page + 8)
        recent = list(range(base + n_int2 + 1, base + n_int2 + 1 + 256 // page + 1))
        plans.append(WritePlan(t, t + 1, [recent[-1] * page + t % page], view_bf16=[base] + recent,
                               view_bf16_len=64 + 256 + t % page, view_int2=list(range(base + 1, base + 1 + n_int2))))
    return plans


def per_call_us(fn, reps: int, rounds: int = 5) -> float:
    """The best of ``rounds`` means over ``reps`` calls (a shared host's noise only adds time)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps)
    return 1e6 * best


def measure(batch: int, context: int, page: int, reps: int) -> dict:
    steps = [decode_plans(batch, context, page, s) for s in range(page + 1)]  # one step crosses a page
    blob = pickle.dumps([steps[0]])
    pickle_us = per_call_us(lambda: pickle.loads(pickle.dumps([steps[0]])), reps)
    first = PlanEncoder().encode(steps[0])
    first_us = per_call_us(lambda: PlanDecoder().decode(PlanEncoder().encode(steps[0])), reps)
    enc, dec, i = PlanEncoder(), PlanDecoder(), [0]
    dec.decode(enc.encode(steps[0]))

    def steady():
        i[0] = i[0] % page + 1
        dec.decode(enc.encode(steps[i[0]]))
    steady_us = per_call_us(steady, reps)
    steady_bytes = max(enc.encode(steps[s]).nbytes for s in (1, 2)) if page > 1 else first.nbytes
    return dict(batch=batch, context=context, page=page, pickle_bytes=len(blob), pickle_us=pickle_us,
                codec_first_bytes=first.nbytes, codec_first_us=first_us, codec_bytes=steady_bytes,
                codec_us=steady_us)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--context", type=int, default=102400)
    p.add_argument("--page-size", type=int, nargs="+", default=[64, 16])
    p.add_argument("--reps", type=int, default=50)
    a = p.parse_args()
    print("| batch | context | P | pickle bytes | pickle us | codec bytes (first) | codec us (first) | "
          "codec bytes | codec us |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for page in a.page_size:
        for batch in (1, 32):
            r = measure(batch, a.context, page, a.reps)
            print(f"| {batch} | {a.context} | {page} | {r['pickle_bytes']:,} | {r['pickle_us']:.0f} | "
                  f"{r['codec_first_bytes']:,} | {r['codec_first_us']:.0f} | {r['codec_bytes']:,} | {r['codec_us']:.1f} |")


if __name__ == "__main__":
    main()
