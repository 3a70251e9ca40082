"""Error of the split-K chunk kernel against the fp32 oracle as each split's share grows (issue 29 diagnostic).

A rows-on-M variant of the chunk kernel (nineteenth session, not kept) read 0.004 relative error against the staged
path at 32 splits over 100K INT2 tokens and 0.064 at 2: growing with the tokens one accumulator sums. This times
nothing: ``chunk_splitk.chunk_attention`` (today's tiles) over a 100K-token INT2 cache (Qwen3-4B/8B attention) at
k = 1 and 64 and 2..64 splits, relative error against ``reference.extend_attention_ref`` (fp32, exact codes).

    python -m lab.scripts.split_error [--context 102400] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from oscarkv.kernels.chunk_splitk import chunk_attention
from oscarkv.kernels.reference import extend_attention_ref
from oscarkv.kernels.synthetic import random_cache


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=102400)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    kv, tables = random_cache([args.context], 8, 128, page=64, group=128, sink=64, recent=256, device="cuda",
                              shuffle=False)
    rows = []
    for k in (1, 64):
        gen = torch.Generator(device="cuda").manual_seed(k)
        q, kn, vn = (torch.randn(k, n, 128, generator=gen, device="cuda").bfloat16() for n in (32, 8, 8))
        cu = torch.tensor([0, k], dtype=torch.int32, device="cuda")
        ref = extend_attention_ref(q.float(), kn, vn, kv, tables, cu, 128**-0.5)
        for splits in (2, 4, 8, 16, 32, 64):
            out = chunk_attention(q, kn, vn, kv, tables, cu, 128**-0.5, k, num_splits=splits).float()
            rows.append(dict(k=k, splits=splits, err=float((out - ref).norm() / ref.norm()),
                             bias=float(((out - ref) * ref).sum() / ref.norm() ** 2)))
            print(f"k {k:3d} splits {splits:3d} rel err {rows[-1]['err']:.2e} bias {rows[-1]['bias']:+.2e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), context=args.context, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
