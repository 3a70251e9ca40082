"""The INT2/INT4 format: bit layout, error bounds, scale guard, BPE arithmetic."""

import math

import pytest
import torch

from oscarkv.quant.bpe import bits_per_element, history_end, tiers
from oscarkv.quant.clip import clip_groups, clip_rank
from oscarkv.quant.int2 import dequantize, fake_quantize, pack, quantize, quantize_codes, unpack


def test_int2_bit_layout_matches_spec():
    g = 16
    codes = torch.randint(0, 4, (3, 2 * g), dtype=torch.uint8)
    packed = pack(codes, 2, g)
    assert packed.shape == (3, 2 * g // 4)
    for row in range(3):
        for grp in range(2):
            for j in range(g // 4):
                byte = int(packed[row, grp * g // 4 + j])
                for i in range(4):  # element j + i*G/4 in bits 2i..2i+1
                    assert (byte >> (2 * i)) & 3 == int(codes[row, grp * g + j + i * g // 4])


def test_int4_bit_layout_is_two_int2_planes():
    """Byte j of plane b (low bits, then high bits) holds bits 2b..2b+1 of elements j + i*G/4 in bits 2i..2i+1."""
    g = 8
    codes = torch.randint(0, 16, (3, 2 * g), dtype=torch.uint8)
    packed = pack(codes, 4, g)
    assert packed.shape == (3, 2 * g // 2)
    n4 = 2 * g // 4  # bytes of one plane
    for row in range(3):
        for plane in range(2):
            for grp in range(2):
                for j in range(g // 4):
                    byte = int(packed[row, plane * n4 + grp * g // 4 + j])
                    for i in range(4):
                        code = int(codes[row, grp * g + j + i * g // 4])
                        assert (byte >> (2 * i)) & 3 == (code >> (2 * plane)) & 3


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("shape,group", [((5, 64), 64), ((3, 7, 128), 32), ((1, 128), 128)])
def test_pack_unpack_roundtrip(bits, shape, group):
    codes = torch.randint(0, 1 << bits, shape, dtype=torch.uint8)
    assert torch.equal(unpack(pack(codes, bits, group), bits, group), codes)


@pytest.mark.parametrize("bits", [2, 4])
def test_error_bounded_by_half_step(bits):
    torch.manual_seed(0)
    x = torch.randn(200, 64) * torch.rand(200, 1) * 10
    g = 32
    p = quantize(x, bits, g)
    xh = dequantize(p, bits, g)
    step = p.scale.float().repeat_interleave(g, -1)
    # half a step, plus the fp16 rounding of the zero point and of the scale times the code
    slack = 1e-3 * x.abs().amax(-1, keepdim=True) + 1e-6
    assert ((xh - x).abs() <= step / 2 + slack).all()
    assert torch.equal(xh, fake_quantize(x, bits, g))


def test_stored_scale_and_zero_are_used():
    x = torch.tensor([[0.1, 0.37, 1.9, 3.33]])
    codes, scale, zero = quantize_codes(x, 2, 4)
    s, m = scale.float(), zero.float()
    expect = torch.floor((x - m) / s + 0.5).clamp(0, 3)
    assert torch.equal(codes.float(), expect)
    assert scale.dtype == torch.float16 and zero.dtype == torch.float16


def test_constant_group_has_zero_scale_and_exact_reconstruction():
    x = torch.full((2, 8), 1.5)
    p = quantize(x, 2, 8)
    assert (p.scale == 0).all()
    assert torch.equal(dequantize(p, 2, 8), x)


def test_extremes_are_representable():
    torch.manual_seed(1)
    x = torch.randn(10, 64)
    codes, _, _ = quantize_codes(x, 2, 64)
    assert (codes.amax(-1) == 3).all() and (codes.amin(-1) == 0).all()


def test_bad_group_rejected():
    with pytest.raises(ValueError, match="divide"):
        quantize(torch.randn(2, 10), 2, 4)
    with pytest.raises(ValueError, match="bits"):
        quantize(torch.randn(2, 8), 3, 8)


def test_clip_threshold_is_rank_of_magnitude():
    g = 64
    x = torch.randn(4, g)
    c = 0.96
    k = clip_rank(c, g)
    assert k == math.floor(c * g) == 61
    y = clip_groups(x, c, g)
    tau = x.abs().sort(-1).values[:, k - 1 : k]
    assert torch.equal(y, x.clamp(-tau, tau))
    assert torch.equal(clip_groups(x, 1.0, g), x) and torch.equal(clip_groups(x, None, g), x)


def test_tier_rule_window_bounds():
    s0, w, p = 64, 256, 16
    for t in range(0, 2000):
        tr = tiers(t, s0, w, p)
        assert sum(tr) == t and tr.sink == min(t, s0)
        if t >= s0 + w:
            assert w <= tr.recent < w + p
            assert tr.history % p == 0
        else:
            assert tr.history == 0
    # monotone: history never shrinks as tokens arrive
    ends = [history_end(t, s0, w, p) for t in range(2000)]
    assert all(b >= a for a, b in zip(ends, ends[1:]))


def test_bpe_formula():
    assert bits_per_element(100, 0, 2, 128) == pytest.approx(2.25)
    assert bits_per_element(100, 0, 2, 64) == pytest.approx(2.5)
    assert bits_per_element(0, 10, 2, 64) == 16.0
    # design example: G=128 at 128K with the default windows
    t = 128 * 1024
    tr = tiers(t, 64, 256, 16)
    bpe = bits_per_element(tr.history, tr.sink + tr.recent, 2, 128)
    assert 2.27 < bpe < 2.29
