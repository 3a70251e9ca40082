"""Error of the split-K chunk kernel against the fp32 oracle as each split's share grows (issue 29 diagnostic).

A rows-on-M variant of the chunk kernel (nineteenth session, not kept) read 0.004 relative error against the staged
path at 32 splits over 100K INT2 tokens and 0.064 at 2: growing with the tokens one accumulator sums. This runs
``chunk_splitk.chunk_attention`` over a 100K-token cache (Qwen3-4B/8B attention; INT2, and BF16 only) at k = 1 and
64 and 2..64 splits: relative error and bias (the output's component along the oracle's, minus one) against
``reference.extend_attention_ref`` (fp32, exact codes); then the default launches' times (CUDA-graph replays, ms a
layer): the chunk kernel at k = 1, 9, 64 and the decode kernel at batch 1 and 32.

    python -m lab.scripts.split_error [--context 102400] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from oscarkv.kernels.chunk_splitk import chunk_attention
from oscarkv.kernels.reference import extend_attention_ref
from oscarkv.kernels.synthetic import random_cache


def _errors(kind: str, kv, tables) -> list[dict]:
    rows = []
    for k in (1, 64):
        gen = torch.Generator(device="cuda").manual_seed(k)
        q, kn, vn = (torch.randn(k, n, 128, generator=gen, device="cuda").bfloat16() for n in (32, 8, 8))
        cu = torch.tensor([0, k], dtype=torch.int32, device="cuda")
        ref = extend_attention_ref(q.float(), kn, vn, kv, tables, cu, 128**-0.5)
        for splits in (2, 8, 64):
            out = chunk_attention(q, kn, vn, kv, tables, cu, 128**-0.5, k, num_splits=splits).float()
            rows.append(dict(kv=kind, k=k, splits=splits, err=float((out - ref).norm() / ref.norm()),
                             bias=float(((out - ref) * ref).sum() / ref.norm() ** 2)))
            r = rows[-1]
            print(f"{kind} k {k:3d} splits {splits:3d} rel err {r['err']:.2e} bias {r['bias']:+.2e}", flush=True)
    return rows


def _times(kind: str, kv, tables) -> dict:
    from lab.benchmarks.chunk_attention import _ms
    from oscarkv.cache.paged_layout import PageTables
    from oscarkv.kernels.decode import decode_attention

    times = {}
    for k in (1, 9, 64):
        q, kn, vn = (torch.randn(k, n, 128, device="cuda").bfloat16() for n in (32, 8, 8))
        cu = torch.tensor([0, k], dtype=torch.int32, device="cuda")
        times[f"{kind} chunk k={k}"] = _ms(lambda: chunk_attention(q, kn, vn, kv, tables, cu, 128**-0.5, k), 10)
    for b in (1, 32):
        tb = PageTables(*(t.expand(b, *t.shape[1:]).contiguous() for t in
                          (tables.bf16_table, tables.bf16_lens, tables.int2_table, tables.int2_lens)))
        q = torch.randn(b, 32, 128, device="cuda").bfloat16()
        times[f"{kind} decode b={b}"] = _ms(lambda: decode_attention(q, kv, tb, 128**-0.5), 10)
    for name, ms in times.items():
        print(f"{name:>22}: {ms:.4f} ms", flush=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=102400)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows, times = [], {}
    for kind in ("int2", "bf16"):
        kv, tables = random_cache([args.context], 8, 128, page=64, group=128, sink=64, recent=256, device="cuda",
                                  shuffle=False, int2=kind == "int2")
        rows += _errors(kind, kv, tables)
        times |= _times(kind, kv, tables)
        del kv, tables
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), context=args.context, rows=rows, ms=times), f, indent=1)


if __name__ == "__main__":
    main()
