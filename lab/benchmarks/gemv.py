"""Skinny-GEMM probe: the decode step's projections at M = 1..32 rows, cuBLAS layouts vs a Triton kernel.

Role: the end-to-end decode step spends ~4.2 ms of a 100K-token Qwen3-4B step on work that does
not scale with context, against 2.67 ms of weight bytes (lab/record/benchmarks-log.md, "What the missed
targets would need"); the GEMVs are most of it. This probe times, per projection of a model
shape (``qkv``, ``o``, ``gate_up``, ``down``; weights ``[N, K]`` bf16 as ``nn.Linear`` holds
them) and row count ``M``:

* ``linear`` — ``F.linear(x, W, b)``, what :mod:`oscarkv.models.llama` runs today;
* ``mm_t`` — ``torch.addmm(b, x, Wt)`` on a pre-transposed contiguous ``Wt [K, N]`` (cuBLAS
  picks other kernels for the other layout);
* ``triton`` — :func:`skinny_kernel`: one program per ``BLOCK_N`` output columns streams its
  ``[BLOCK_N, K]`` weight rows through ``tl.dot`` with the ``M`` rows padded to 16 (the tensor
  cores are idle anyway; the dot lets Triton software-pipeline the weight loads), best of a
  small config sweep, checked against fp32.

Each time is the median of CUDA-graph replays rotating over enough weight copies that L2 cannot
serve them; ``%copy`` = weight bytes / time / measured copy bandwidth.
``python -m lab.benchmarks.gemv OUT_DIR [SHAPE]`` prints a table and writes ``OUT_DIR/gemv.json``.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lab.benchmarks.variants_common import L2_BYTES, graph_us
from oscarkv.models.shapes import SHAPES


@triton.jit
def skinny_kernel(X, W, B, Y, M, N, K: tl.constexpr, stride_xm, stride_wn, stride_ym, HAS_BIAS: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``Y[m, n] = Σ_k X[m, k] W[n, k] (+ B[n])`` for ``M <= 16``; X, W bf16 row-major, fp32 accumulate."""
    pid = tl.program_id(0)
    rm = tl.arange(0, 16)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(X + rm[:, None] * stride_xm + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(W + rn[None, :] * stride_wn + (k0 + rk)[:, None])  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        acc += tl.load(B + rn).to(tl.float32)[None, :]
    tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty), mask=rm[:, None] < M)


def skinny(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, cfg: dict) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    if m > 16 or n % cfg["BLOCK_N"] or k % cfg["BLOCK_K"]:
        raise ValueError(f"skinny: M={m} (<= 16), N={n} % {cfg['BLOCK_N']}, K={k} % {cfg['BLOCK_K']}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    skinny_kernel[(n // cfg["BLOCK_N"],)](x, w, b if b is not None else w, y, m, n, k, x.stride(0), w.stride(0),
                                          y.stride(0), HAS_BIAS=b is not None, BLOCK_N=cfg["BLOCK_N"],
                                          BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
                                          num_stages=cfg["num_stages"])
    return y


CONFIGS = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
           for bn, bk, nw, ns in itertools.product((16, 32, 64), (256, 512), (4,), (3, 5))]


def projections(shape: str) -> dict[str, tuple[int, int, bool]]:
    """``name -> (N, K, bias)`` of one decoder layer (stacked qkv and gate_up as the engine runs them)."""
    c = SHAPES[shape]
    d, h, hq, hkv = c["head_dim"], c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    return {"qkv": ((hq + 2 * hkv) * d, h, False), "o": (h, hq * d, True),
            "gate_up": (2 * c["intermediate_size"], h, False), "down": (h, c["intermediate_size"], False)}


def main(out: Path, shape: str = "qwen3-4b", rows: tuple[int, ...] = (1, 8, 16)) -> None:
    from oscarkv.bench.attention import copy_bandwidth

    copy = copy_bandwidth()
    results = []
    for name, (n, k, bias) in projections(shape).items():
        copies = max(2, -(-4 * L2_BYTES // (n * k * 2)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(copies)]
        wts = [w.t().contiguous() for w in ws]
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ ws[0].float().t() + (b.float() if bias else 0)
            row = {"shape": shape, "proj": name, "N": n, "K": k, "M": m}
            row["linear_us"] = graph_us([lambda w=w: F.linear(x, w, b) for w in ws])
            row["mm_t_us"] = graph_us([lambda w=w: torch.addmm(b, x, w) if bias else x @ w for w in wts])
            best = None
            for cfg in CONFIGS:
                if n % cfg["BLOCK_N"] or k % cfg["BLOCK_K"]:
                    continue
                try:
                    err = ((skinny(x, ws[0], b, cfg).float() - ref).norm() / ref.norm()).item()
                except triton.runtime.errors.OutOfResources:  # stages x tile beyond shared memory
                    continue
                if err > 1e-2:
                    raise AssertionError(f"skinny {cfg} at {name} M={m}: rel err {err:.2e}")
                us = graph_us([lambda w=w: skinny(x, w, b, cfg) for w in ws], reps=4)
                if best is None or us < best[0]:
                    best = (us, cfg, err)
            row.update(triton_us=best[0], triton_cfg=best[1], triton_err=best[2])
            for key in ("linear", "mm_t", "triton"):
                row[f"{key}_pct"] = 100 * n * k * 2 / (row[f"{key}_us"] * 1e-6) / (copy * 1e9)
            results.append(row)
            print(json.dumps(row), flush=True)
    (out / "gemv.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy,
                                               "rows": results}, indent=1))
    print(f"\n{'proj':8} {'M':>3} {'linear µs (%copy)':>18} {'Wt addmm':>16} {'triton':>16}  best triton config")
    for r in results:
        print(f"{r['proj']:8} {r['M']:>3} {r['linear_us']:>9.1f} ({r['linear_pct']:3.0f}%) {r['mm_t_us']:>9.1f} "
              f"({r['mm_t_pct']:3.0f}%) {r['triton_us']:>9.1f} ({r['triton_pct']:3.0f}%)  {r['triton_cfg']}")
    for key in ("linear", "mm_t", "triton"):
        for m in rows:
            total = sum(r[f"{key}_us"] for r in results if r["M"] == m)
            print(f"layer total, M={m}, {key}: {total:.1f} µs")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
