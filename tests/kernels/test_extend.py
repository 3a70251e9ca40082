"""Prefill/extend kernel vs the fp32 oracle: chunks over cached BF16 + INT2 pages and themselves
(causal), several chunks of different lengths in one batch, GQA 1/4, G < d, BF16-only caches, 4-bit keys
and/or values;
CPU interpreter at small shapes, GPU at real ones."""

import pytest
import torch

from oscarkv.kernels.extend import extend_attention
from oscarkv.kernels.reference import extend_attention_ref, gather_sequence
from oscarkv.kernels.synthetic import random_cache

CUDA = torch.cuda.is_available()


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


def _bf16_error(q, k_new, v_new, kv, tables, cu, scale, ref):
    """‖bf16 PyTorch attention − oracle‖ / ‖oracle‖ on the same inputs: the tolerance unit."""
    outs = []
    for b in range(len(cu) - 1):
        lo, hi = int(cu[b]), int(cu[b + 1])
        kc, vc = gather_sequence(kv, tables, b)
        k = torch.cat([kc, k_new[lo:hi].float().transpose(0, 1)], 1).bfloat16()
        v = torch.cat([vc, v_new[lo:hi].float().transpose(0, 1)], 1).bfloat16()
        rep = q.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        c, n = hi - lo, kc.shape[1]
        mask = torch.cat([torch.ones(c, n, dtype=torch.bool, device=q.device),
                          torch.ones(c, c, dtype=torch.bool, device=q.device).tril()], 1)
        o = torch.nn.functional.scaled_dot_product_attention(q[lo:hi].transpose(0, 1).bfloat16(), k, v,
                                                             attn_mask=mask, scale=scale)
        outs.append(o.transpose(0, 1))
    return _rel(torch.cat(outs), ref)


def as_views(q, k, v):
    """``q, k, v`` as the fused input maps hand them over: q and k heads of one buffer, v heads of the projection's
    output (row strides ``(Hq + H)·d`` and ``(Hq + 2H)·d``: no copy may be needed)."""
    hq, h = q.shape[1], k.shape[1]
    qk, qkv = torch.cat([q, k], 1), torch.cat([q, k, v], 1)
    q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + h:]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous()) and k.stride(0) != v.stride(0)
    return q, k, v


def _check(cached, chunks, hq, h, d, *, group=None, int2=True, page=16, sink=32, recent=64, device="cpu", seed=0,
           bits=(2, 2), levels=(None, None), views=False):
    kv, tables = random_cache(cached, h, d, page=page, group=group, sink=sink, recent=recent, int2=int2,
                              device=device, seed=seed, bits=bits, levels=levels)
    gen = torch.Generator(device=device).manual_seed(seed + 7)
    t = sum(chunks)
    q = torch.randn(t, hq, d, generator=gen, device=device).bfloat16()
    k_new = torch.randn(t, h, d, generator=gen, device=device).bfloat16()
    v_new = torch.randn(t, h, d, generator=gen, device=device).bfloat16()
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32, device=device)
    # NOTE: fp32 (bf16 values) on the CPU: the interpreter truncates fp32 → bf16 casts.
    cast = (lambda x: x) if device == "cuda" else (lambda x: x.float())
    args = (cast(q), cast(k_new), cast(v_new))
    out = extend_attention(*(as_views(*args) if views else args), kv, tables, cu, d**-0.5)
    ref = extend_attention_ref(q.float(), k_new, v_new, kv, tables, cu, d**-0.5)
    assert torch.isfinite(out).all()
    tol = 2 * _bf16_error(q, k_new, v_new, kv, tables, cu, d**-0.5, ref)
    assert _rel(out, ref) <= max(tol, 1e-3), (_rel(out, ref), tol)


CPU_CASES = [  # (cached lens, chunk lens, Hq, H, d, group, int2)
    ([150, 0], [5, 19], 8, 2, 64, None, True),  # history + windows; an empty cache (first chunk)
    ([37], [33], 2, 2, 32, 16, True),  # GQA 1, G < d, cache inside the window
    ([99, 20], [1, 17], 4, 1, 32, None, False),  # BF16-only cache, a one-token chunk
]


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("cached,chunks,hq,h,d,group,int2", CPU_CASES)
def test_extend_matches_oracle_cpu(cached, chunks, hq, h, d, group, int2):
    _check(cached, chunks, hq, h, d, group=group, int2=int2, seed=len(chunks) + d)


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
def test_extend_reads_strided_views_cpu():
    """q, k and v as views with different row strides (``as_views``), read in place."""
    _check([150, 0], [5, 19], 8, 2, 64, seed=3, views=True)


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("bits", [(4, 2), (2, 4), (4, 4)], ids=["k4v2", "k2v4", "int4"])
@pytest.mark.parametrize("group", [None, 16])
def test_extend_rungs_match_oracle_cpu(bits, group):
    """4-bit keys and/or values (two INT2 planes): one group per head, and G < d."""
    _check([150, 0], [5, 19], 8, 2, 32, group=group, seed=bits[0] + 2 * bits[1], bits=bits)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("bits", [(4, 2), (2, 4), (4, 4)], ids=["k4v2", "k2v4", "int4"])
def test_extend_rungs_gpu(bits):
    _check([20011, 9000, 0], [1000, 2048, 300], 32, 8, 128, group=128, page=64, sink=64, recent=256,
           device="cuda", bits=bits)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("int2", [True, False])
def test_extend_real_shape_gpu(group, int2):
    """Qwen3-8B attention shape: chunks of 1000 and 2048 tokens over 9000 and 20011 cached ones."""
    _check([20011, 9000, 0], [1000, 2048, 300], 32, 8, 128, group=group, int2=int2, page=64, sink=64, recent=256,
           device="cuda", seed=group)
