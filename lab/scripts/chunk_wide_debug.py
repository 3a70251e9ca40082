"""One chunk_wide case in this process (issue 29 diagnostic): ``python -m lab.scripts.chunk_wide_debug KIND ROWS WARPS
STAGES BLOCK_N CACHED CHUNK`` prints the relative error against the oracle or the CUDA error."""

from __future__ import annotations

import sys
import traceback

import torch

from oscarkv.kernels.chunk_splitk import chunk_attention
from oscarkv.kernels.reference import extend_attention_ref
from oscarkv.kernels.synthetic import random_cache


def main(kind: str, rows: int, warps: int, stages: int, block_n: int, cached: int, chunk: int) -> None:
    kv, tables = random_cache([cached], 8, 128, page=64, group=128, sink=64, recent=256, int2=kind == "int2",
                              device="cuda", seed=1)
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, kn, vn = (torch.randn(chunk, n, 128, generator=gen, device="cuda").bfloat16() for n in (32, 8, 8))
    cu = torch.tensor([0, chunk], dtype=torch.int32, device="cuda")
    cfg = {"WIDE": True, "ROWS": rows, "num_warps": warps, "num_stages": stages, "BLOCK_N": block_n}
    try:
        out = chunk_attention(q, kn, vn, kv, tables, cu, 128**-0.5, chunk, config=cfg)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 -- the diagnostic reports it
        print(f"{sys.argv[1:]} ERROR {type(e).__name__}: {str(e)[:100]}", flush=True)
        traceback.print_exc(limit=-4)
        return
    ref = extend_attention_ref(q.float(), kn, vn, kv, tables, cu, 128**-0.5)
    print(f"{sys.argv[1:]} rel {float((out.float() - ref).norm() / ref.norm()):.2e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
