"""Lab probe (one H100 call): which PyTorch attention backends return a log-sum-exp at prefill shapes,
how fast each is, and the current extend kernel at the same shapes. Prints a table, writes JSON to argv[1]."""

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

A = torch.ops.aten
HQ, H, D = 32, 8, 128
rows = []


def flops(sq, sk, heads, causal):
    return 4 * sq * sk * heads * D * (0.5 if causal else 1.0)


def bench(name, fn, fl):
    try:
        fn()
        torch.cuda.synchronize()
        ms = do_bench(fn, warmup=25, rep=150, return_mode="median")
        rows.append(dict(name=name, ms=ms, tflops=fl / ms / 1e9))
    except Exception as e:  # noqa: BLE001 - a probe: record what fails
        rows.append(dict(name=name, error=f"{type(e).__name__}: {str(e)[:160]}"))
    print(rows[-1], flush=True)


def rnd(*s):
    return torch.randn(*s, device="cuda", dtype=torch.bfloat16)


def main(out):
    n, c = 98304, 8192
    sc = D ** -0.5
    # floor: whole-prompt causal attention, public SDPA per backend
    for full in (32768, 102400):
        q, k, v = rnd(1, HQ, full, D), rnd(1, H, full, D), rnd(1, H, full, D)
        for be in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", None):
            def f(be=be):
                if be is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                with sdpa_kernel([getattr(SDPBackend, be)]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            bench(f"floor sdpa causal gqa n={full} {be or 'default'}", f, flops(full, full, HQ, True))
        del q, k, v
    # prefix part: stacked GQA queries, non-causal, with LSE
    qs, k, v = rnd(1, H, 4 * c, D), rnd(1, H, n, D), rnd(1, H, n, D)
    bench("prefix cudnn lse stacked", lambda: A._scaled_dot_product_cudnn_attention(qs, k, v, None, True, 0.0, False, False, scale=sc), flops(4 * c, n, H, False))
    bench("prefix flash lse stacked", lambda: A._scaled_dot_product_flash_attention(qs, k, v, 0.0, False, False, scale=sc), flops(4 * c, n, H, False))
    bench("prefix efficient lse stacked", lambda: A._scaled_dot_product_efficient_attention(qs, k, v, None, True, 0.0, False, scale=sc), flops(4 * c, n, H, False))
    o = A._scaled_dot_product_cudnn_attention(qs[:, :, :256], k[:, :, :1024], v[:, :, :1024], None, True, 0.0, False, False, scale=sc)
    ref = F.scaled_dot_product_attention(qs[:, :, :256].float(), k[:, :, :1024].float(), v[:, :, :1024].float(), scale=sc)
    lref = torch.logsumexp((qs[:, :, :256].float() @ k[:, :, :1024].float().transpose(-1, -2)) * sc, -1)
    rows.append(dict(name="cudnn check", out_err=((o[0].float() - ref).norm() / ref.norm()).item(), lse_shape=list(o[1].shape),
                     lse_err=(o[1].reshape(lref.shape) - lref).abs().max().item(), out_stride=list(o[0].stride())))
    print(rows[-1])
    o = A._scaled_dot_product_flash_attention(qs[:, :, :256], k[:, :, :1024], v[:, :, :1024], 0.0, False, False, scale=sc)
    rows.append(dict(name="flash check", out_err=((o[0].float() - ref).norm() / ref.norm()).item(), lse_shape=list(o[1].shape),
                     lse_err=(o[1].reshape(lref.shape) - lref).abs().max().item()))
    print(rows[-1])
    # chunk part: causal, square
    q, kc, vc = rnd(1, HQ, c, D), rnd(1, H, c, D), rnd(1, H, c, D)
    ke, ve = kc.repeat_interleave(4, 1), vc.repeat_interleave(4, 1)
    bench("chunk cudnn lse causal expanded", lambda: A._scaled_dot_product_cudnn_attention(q, ke, ve, None, True, 0.0, True, False, scale=sc), flops(c, c, HQ, True))
    bench("chunk cudnn lse causal gqa", lambda: A._scaled_dot_product_cudnn_attention(q, kc, vc, None, True, 0.0, True, False, scale=sc), flops(c, c, HQ, True))
    bench("chunk flash lse causal gqa", lambda: A._scaled_dot_product_flash_attention(q, kc, vc, 0.0, True, False, scale=sc), flops(c, c, HQ, True))
    bench("chunk flash lse causal expanded", lambda: A._scaled_dot_product_flash_attention(q, ke, ve, 0.0, True, False, scale=sc), flops(c, c, HQ, True))
    # varlen FA2: the whole extend in one call (bottom-right causal)
    qv = rnd(c, HQ, D)
    kv_ = rnd(n + c, H, D)
    cq = torch.tensor([0, c], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, n + c], dtype=torch.int32, device="cuda")
    bench("varlen fa2 causal gqa whole", lambda: A._flash_attention_forward(qv, kv_, kv_, cq, ck, c, n + c, 0.0, True, False, scale=sc), flops(c, n, HQ, False) + flops(c, c, HQ, True))
    # current extend kernel
    from oscarkv.kernels.extend import extend_attention
    from oscarkv.kernels.synthetic import random_cache
    for int2 in (True, False):
        kvp, tables = random_cache([n], H, D, page=64, group=128, sink=64, recent=256, int2=int2, device="cuda", seed=1)
        qf = torch.randn(c, HQ, D, device="cuda")
        kn, vn = torch.randn(c, H, D, device="cuda"), torch.randn(c, H, D, device="cuda")
        cu = torch.tensor([0, c], dtype=torch.int32, device="cuda")
        bench(f"extend kernel int2={int2}", lambda: extend_attention(qf, kn, vn, kvp, tables, cu, sc, max_chunk=c), flops(c, n, HQ, False) + flops(c, c, HQ, True))
        kvp = tables = None  # NOTE: frees them (rebound, not del: the timed lambda closes over these names)
    # GEMM rate
    x, w = rnd(8192, 2560), rnd(9728, 2560)
    bench("gemm 8192x2560x9728", lambda: x @ w.t(), 2 * 8192 * 2560 * 9728)
    json.dump(rows, open(out, "w"), indent=1)
    print("\n%-45s %10s %8s" % ("probe", "ms", "TFLOP/s"))
    for r in rows:
        print("%-45s %10s %8s %s" % (r["name"], f"{r['ms']:.3f}" if "ms" in r else "-", f"{r['tflops']:.0f}" if "tflops" in r else "-", r.get("error", "")[:80]))


if __name__ == "__main__":
    main(sys.argv[1])
