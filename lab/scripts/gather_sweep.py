"""The staged path's gather kernels (``kernels.prefill``) at 100K cached tokens: tokens per program × warps (one GPU).

A 512-token prefill step stages its whole cached prefix per layer: BF16 pages copied, INT2 pages dequantized into a
bf16 workspace. On an H200 (``lab/results/gpu_prefill_chunk512/profile_32k.json``) the INT2 gather took twice the
BF16 one for fewer bytes. This times both at 100K tokens (Qwen3-4B/8B: 8 KV heads, d = 128, page 64, G = 128) for
BLOCK ∈ {32, 64, 128} × num_warps ∈ {2, 4, 8} (INT2: element by element, ``extend._dequant``, and slice by
slice, ``prefill._raw_rows``), checks each against the first path's output (bit-equal), and prints ms and the bytes
rate (read + written); then the staged path (``prefill_attention``) at 64 and 512 new tokens, INT2 with either gather.

    python -m lab.scripts.gather_sweep --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton

from lab.benchmarks.chunk_attention import _ms as ms

H, D, CTX = 8, 128, 102400


def main() -> None:
    from oscarkv.kernels import prefill
    from oscarkv.kernels.pools import format_args, history_arg, window_arg
    from oscarkv.kernels.synthetic import random_cache

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    res = dict(device=torch.cuda.get_device_name(), ctx=CTX, rows=[])
    for int2 in (True, False):
        kv, tables = random_cache([CTX], H, D, page=64, group=128, sink=64, recent=256, int2=int2, device="cuda",
                                  shuffle=False)
        nb, ni = (x[0] for x in tables.lens())
        n, table = (ni, tables.int2_table[0]) if int2 else (nb, tables.bf16_table[0])
        p = kv.bf16_k.shape[2]
        k = torch.empty(1, H, n, D, dtype=torch.bfloat16, device="cuda")
        v = torch.empty_like(k)
        out, span = (k, v, k.stride(1)), (0, n, 0)
        read = (D * 2 // 8 + 4) * 2 * H * n if int2 else 2 * 2 * H * n * D  # INT2: codes, a bf16 scale and zero per G
        moved = read + 2 * 2 * H * n * D

        def launch(block, warps, raw=False):
            grid = (triton.cdiv(n, block), H)
            if int2:
                prefill._gather_int2_kernel[grid](history_arg(kv), table, out, span, D=D, G=kv.int2_k.group, P=p,
                                                  BLOCK=block, num_warps=warps, **format_args(kv),
                                                  **({"RAW": True, "CONV": 2} if raw else {}))
            else:
                prefill._gather_bf16_kernel[grid](window_arg(kv), table, out, span, D=D, P=p, BLOCK=block,
                                                  num_warps=warps)
        launch(prefill.BLOCK_INT2 if int2 else prefill.BLOCK, 4)
        ref = (k.clone(), v.clone())
        for raw, block, warps in itertools.product((True, False) if int2 else (False,), (32, 64, 128), (2, 4, 8)):
            k.zero_(), v.zero_()
            try:
                t = ms(lambda: launch(block, warps, raw))
            except Exception as e:  # NOTE: too many registers or shared memory at a large BLOCK
                res["rows"].append(dict(int2=int2, raw=raw, block=block, warps=warps, error=str(e)[:120]))
                continue
            same = torch.equal(k, ref[0]) and torch.equal(v, ref[1])
            res["rows"].append(dict(int2=int2, raw=raw, block=block, warps=warps, ms=t, gbs=moved / t / 1e6,
                                    equal=same))
            print(f"{'int2' if int2 else 'bf16'}{' raw' if raw else ''} BLOCK {block:>3} warps {warps}: {t:.3f} ms "
                  f"{moved / t / 1e6:7.0f} GB/s{'' if same else '  MISMATCH'}", flush=True)
            (args.out / "gather_sweep.json").write_text(json.dumps(res, indent=1))
        res["staged"] = res.get("staged", {}) | _staged(kv, tables, int2)
    (args.out / "gather_sweep.json").write_text(json.dumps(res, indent=1))


def _staged(kv, tables, int2: bool) -> dict:
    """The staged path (``prefill_attention``) of 64 and 512 new tokens over the cache, ms a layer; over INT2 with
    the raw gather (``raw_gather`` patched on, 32 tokens, 4 warps) and today's (``extend._dequant``)."""
    from oscarkv.kernels import prefill

    out, lens, default = {}, tables.lens(), prefill.raw_gather
    for k in (64, 512):
        q, kn, vn = (torch.randn(k, n, D, device="cuda").bfloat16() for n in (4 * H, H, H))
        fn = lambda: prefill.prefill_attention(q, kn, vn, kv, tables, 0, (lens[0][0], lens[1][0]), D**-0.5)  # noqa: E731
        raw = lambda kv, cuda: (32, 4, {"RAW": True, "CONV": 2})  # noqa: E731
        for name, patch in (("raw", raw), ("dequant", default)):
            if name == "raw" and not int2:
                continue
            prefill.raw_gather = patch
            try:
                key = f"{'int2 ' + name if int2 else 'bf16'} k={k}"
                out[key] = t = ms(fn, 5)
            finally:
                prefill.raw_gather = default
            print(f"staged {key}: {t:.3f} ms", flush=True)
    return out


if __name__ == "__main__":
    main()
