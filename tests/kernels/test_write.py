"""Write-path kernel vs the quantizer spec, 2- and 4-bit: code bytes bit-identical to ``TensorCodec.encode`` of
the stored BF16 values, demotion bit-identical to ``demote_ref`` (one layer, and every layer at
once with per-layer clips), rotation within one BF16 ulp; the engine's stored-domain K/V store
bit-identical to a PyTorch scatter."""

import pytest
import torch

from oscarkv.cache.paged_layout import Int2Pages
from oscarkv.kernels.reference import demote_ref, encode_ref, write_ref
from oscarkv.kernels.write import demote_layers, demote_pages, store_kv, write_tokens
from oscarkv.quant.codec import TensorCodec

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _codec(h, d, g, clip, seed, bits=2):
    gen = torch.Generator().manual_seed(seed)
    rot = torch.linalg.qr(torch.randn(h, d, d, generator=gen))[0].contiguous()
    return TensorCodec(bits, g, rotation=rot.to(DEV), mean=torch.randn(h, d, generator=gen).to(DEV), clip=clip)


def _pools(n, h, p, d, g, bits=2):
    nan = float("nan")
    return (torch.full((n, h, p, d), nan, device=DEV).bfloat16(),
            Int2Pages(torch.zeros(n, h, p, d * bits // 8, dtype=torch.uint8, device=DEV),
                      torch.full((n, h, p, d // g), nan, device=DEV).half(), torch.full((n, h, p, d // g), nan, device=DEV).half(),
                      bits))


def _same(a: Int2Pages, b: Int2Pages) -> bool:
    return all(torch.equal(getattr(a, f).nan_to_num(7), getattr(b, f).nan_to_num(7)) for f in ("codes", "scale", "zero"))


SHAPES = [(2, 32, 16, 4, 0.9, 11), (1, 64, 64, 8, None, 5)] if not CUDA else \
    [(8, 128, 128, 64, 0.96, 1000), (8, 128, 64, 64, 0.92, 333), (8, 64, 64, 16, None, 77)]


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("h,d,g,p,clip,t", SHAPES)
def test_write_tokens_bit_identical(h, d, g, p, clip, t, bits):
    codec = _codec(h, d, g, clip, seed=t, bits=bits)
    x = torch.randn(t, h, d, device=DEV).bfloat16()
    n_pages = 2 * (t // p + 2)
    perm = torch.randperm(n_pages * p - p, device=DEV)[:t] + p  # random distinct slots, never page 0
    tier = torch.rand(t, device=DEV) < 0.5
    bs = torch.where(tier, perm, -1).int()
    is_ = torch.where(~tier, perm, -1).int()
    b1, i1 = _pools(n_pages, h, p, d, g, bits)
    b2, i2 = _pools(n_pages, h, p, d, g, bits)
    write_tokens(x, codec, b1, bs, i1, is_)
    write_ref(x, codec, b2, bs, i2, is_)
    assert torch.equal(b1.isnan(), b2.isnan()), "wrote a different set of BF16 slots"
    ulp = (b2.float().abs() * 2.0**-7).nan_to_num(0)  # one BF16 ulp (upper bound)
    assert ((b1.float() - b2.float()).nan_to_num(0).abs() <= ulp).all()
    # INT2 bytes: bit-identical to the spec applied to the kernel's own BF16 rotated values
    keep = is_ >= 0
    got_pages, got_off = is_[keep].long() // p, is_[keep].long() % p
    kernel_rows = _kernel_rotated(x, codec, h, p, d)[keep]
    ref = encode_ref(kernel_rows, codec)
    assert torch.equal(i1.codes[got_pages, :, got_off], ref.codes)
    assert torch.equal(i1.scale[got_pages, :, got_off], ref.scale) and torch.equal(i1.zero[got_pages, :, got_off], ref.zero)


def _kernel_rotated(x, codec, h, p, d):
    """The kernel's own BF16 rotated values of every token of ``x``."""
    t = x.shape[0]
    pool = torch.zeros((t + p - 1) // p + 1, h, p, d, device=DEV).bfloat16()
    write_tokens(x, codec, pool, torch.arange(p, p + t, device=DEV).int())
    return pool.transpose(1, 2).reshape(-1, h, d)[p : p + t]


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("h,d,g,p,clip,t", SHAPES)
def test_demotion_bit_identical(h, d, g, p, clip, t, bits):
    codec = _codec(h, d, g, clip, seed=t + 1, bits=bits)
    b, i1 = _pools(6, h, p, d, g, bits)
    _, i2 = _pools(6, h, p, d, g, bits)
    b.copy_(torch.randn(b.shape, device=DEV).bfloat16())
    src, dst = torch.tensor([3, 1], device=DEV).int(), torch.tensor([2, 5], device=DEV).int()
    demote_pages(b, src, i1, dst, codec)
    demote_ref(b, src, i2, dst, codec)
    assert _same(i1, i2)
    assert torch.isnan(i1.scale[[0, 1, 3, 4]]).all(), "wrote pages it was not asked to"


@pytest.mark.parametrize("clips,bits", [((None, None, None), 2), ((0.9, None, 0.9), 2), ((0.9, None, 0.9), 4)])
def test_demote_layers_bit_identical(clips, bits):
    h, d, g, p = (8, 128, 128, 64) if CUDA else (2, 32, 16, 4)
    codecs = [_codec(h, d, g, c, seed=i, bits=bits) for i, c in enumerate(clips)]
    pools = [_pools(7, h, p, d, g, bits) for _ in clips]
    bf16 = torch.stack([b for b, _ in pools])
    bf16.copy_(torch.randn(bf16.shape, device=DEV).bfloat16())
    mine = Int2Pages(*(torch.stack([getattr(i, f) for _, i in pools]) for f in ("codes", "scale", "zero")), bits)
    src, dst = torch.tensor([3, 1, 6], device=DEV).int(), torch.tensor([2, 5, 1], device=DEV).int()
    demote_layers(bf16, src, mine, dst, codecs)
    for layer, (codec, (_, ref)) in enumerate(zip(codecs, pools)):
        demote_ref(bf16[layer], src, ref, dst, codec)
        assert _same(Int2Pages(mine.codes[layer], mine.scale[layer], mine.zero[layer], bits), ref), layer
        assert torch.isnan(mine.scale[layer, [0, 3, 4, 6]]).all(), "wrote pages it was not asked to"


@pytest.mark.parametrize("separate", [False, True, "mixed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32] if CUDA else [torch.bfloat16])
def test_store_kv_matches_scatter(dtype, separate):
    """K and V as strided views of a fused qkv row, or with different layouts, or (``mixed``, an OSCAR
    decode step with uncentered values) fp32 keys next to the bf16 values of the projection; slot -1 is
    skipped. (fp32 inputs on CUDA only: the interpreter truncates fp32 → bf16; the mixed keys hold
    bf16 values.)"""
    t, hq, h, d, p = 5, 8, 2, 64, 4
    qkv = torch.randn(t, hq + 2 * h, d, device=DEV, dtype=dtype)
    k, v = qkv[:, hq:hq + h], qkv[:, hq + h:]
    if separate == "mixed":
        k = k.bfloat16().float()
    elif separate:  # the oscar route: k rotated by an einsum (its own layout), v a new tensor
        k, v = k.transpose(0, 1).contiguous().transpose(0, 1), v.contiguous()
    slots = torch.tensor([9, 4, -1, 22, 5], dtype=torch.int32, device=DEV)
    pools = [torch.full((7, h, p, d), float("nan"), device=DEV).bfloat16() for _ in range(4)]
    store_kv(k, v, pools[0], pools[1], slots)
    keep = slots >= 0
    s = slots[keep].long()
    for pool, x in ((pools[2], k), (pools[3], v)):
        pool[s // p, :, s % p] = x[keep].bfloat16()
    assert torch.equal(pools[0].nan_to_num(7), pools[2].nan_to_num(7))
    assert torch.equal(pools[1].nan_to_num(7), pools[3].nan_to_num(7))
