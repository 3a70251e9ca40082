"""Every kernel with a non-uniform 2-bit level table (``Int2Pages.levels``, ``TensorCodec.levels``) against its
oracle: writes and demotions bit-identical to ``TensorCodec.encode`` (a demotion of layers with and without a
table in one call), decode (generic and raw-code kernels; keys, values or both with a table), extend and the
staged prefill within the bf16 tolerance; CPU interpreter at small shapes, GPU at real ones."""

import pytest
import torch

from oscarkv.kernels.prefill import prefill_attention
from oscarkv.kernels.reference import demote_ref
from oscarkv.kernels.write import demote_layers
from tests.kernels import test_decode, test_extend, test_prefill, test_write
from tests.kernels.test_extend import _rel

CUDA = torch.cuda.is_available()
LM = (0.0, 0.8125, 2.1875, 3.0)  # a Lloyd-Max-like table (fp16 values)
TABLES = {"both": (LM, LM), "keys": (LM, None), "values": (None, LM)}


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("which", list(TABLES))
@pytest.mark.parametrize("lens,hq,h,d,group,splits", [
    ([300, 45], 8, 2, 64, None, 7),  # raw-code kernel, one group per token
    ([150, 99], 8, 2, 128, 64, 2),  # raw-code kernel, two groups per token
    ([200, 1], 8, 1, 32, 16, 2),  # generic kernel (G < d)
])
def test_decode_levels_cpu(lens, hq, h, d, group, splits, which):
    test_decode._check(lens, hq, h, d, group=group, splits=splits, seed=d, levels=TABLES[which])


def test_decode_levels_change_the_output():
    """The oracle reads the table (a kernel ignoring it would fail the tests above)."""
    from dataclasses import replace

    from oscarkv.kernels.reference import decode_attention_ref
    from oscarkv.kernels.synthetic import random_cache

    kv, tables = random_cache([200], 2, 32, page=16, sink=32, recent=64, levels=(LM, LM))
    q = torch.randn(1, 4, 32)
    uniform = replace(kv, int2_k=replace(kv.int2_k, levels=None), int2_v=replace(kv.int2_v, levels=None))
    assert _rel(decode_attention_ref(q, uniform, tables, 0.2), decode_attention_ref(q, kv, tables, 0.2)) > 0.01


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("which", list(TABLES))
@pytest.mark.parametrize("group", [None, 16])
def test_extend_levels_cpu(group, which):
    test_extend._check([150, 0], [5, 19], 8, 2, 32, group=group, seed=3, levels=TABLES[which])


@pytest.mark.parametrize("which", ["both", "values"])
def test_prefill_levels(which):
    kv, tables, q, k_new, v_new, _, ref, tol = test_prefill._inputs([150], [40], 8, 2, 64, seed=5, levels=TABLES[which])
    out = prefill_attention(q, k_new, v_new, kv, tables, 0, tables.lens()[0][:1] + tables.lens()[1][:1], 0.125,
                            segment=48)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


def _level_codec(h, d, g, clip, seed, levels=LM):
    from dataclasses import replace

    return replace(test_write._codec(h, d, g, clip, seed), levels=levels)


@pytest.mark.parametrize("h,d,g,p,clip,t", test_write.SHAPES)
def test_write_levels_bit_identical(h, d, g, p, clip, t):
    """New tokens (BF16 and INT2 slots) and demotions: the INT2 bytes of ``TensorCodec.encode`` with the table."""
    from oscarkv.kernels.reference import encode_ref
    from oscarkv.kernels.write import demote_pages, write_tokens

    codec = _level_codec(h, d, g, clip, seed=t)
    x = torch.randn(t, h, d, device=test_write.DEV).bfloat16()
    b1, i1 = test_write._pools(2 * (t // p + 2), h, p, d, g)
    slots = (torch.arange(t, device=test_write.DEV) + p).int()
    write_tokens(x, codec, b1, torch.full_like(slots, -1), i1, slots)
    rows = test_write._kernel_rotated(x, codec, h, p, d)
    ref = encode_ref(rows, codec)
    s = slots.long()
    assert torch.equal(i1.codes[s // p, :, s % p], ref.codes)
    b, d1 = test_write._pools(6, h, p, d, g)
    _, d2 = test_write._pools(6, h, p, d, g)
    b.copy_(torch.randn(b.shape, device=test_write.DEV).bfloat16())
    src, dst = torch.tensor([3, 1], device=b.device).int(), torch.tensor([2, 5], device=b.device).int()
    demote_pages(b, src, d1, dst, codec)
    demote_ref(b, src, d2, dst, codec)
    assert test_write._same(d1, d2)


def test_demote_layers_mixed_tables_bit_identical():
    """Layers with different tables, and one uniform, demoted in one call: each layer its own bytes."""
    from oscarkv.cache.paged_layout import Int2Pages

    h, d, g, p = (8, 128, 128, 64) if CUDA else (2, 32, 16, 4)
    tables = [LM, None, (0.0, 1.0, 2.0, 3.0), (0.0, 1.25, 1.75, 3.0)]
    codecs = [_level_codec(h, d, g, 0.9, seed=i, levels=lv) for i, lv in enumerate(tables)]
    pools = [test_write._pools(7, h, p, d, g) for _ in tables]
    bf16 = torch.stack([b for b, _ in pools])
    bf16.copy_(torch.randn(bf16.shape, device=bf16.device).bfloat16())
    mine = Int2Pages(*(torch.stack([getattr(i, f) for _, i in pools]) for f in ("codes", "scale", "zero")))
    src, dst = torch.tensor([3, 1, 6], device=bf16.device).int(), torch.tensor([2, 5, 1], device=bf16.device).int()
    demote_layers(bf16, src, mine, dst, codecs)
    for layer, (codec, (_, ref)) in enumerate(zip(codecs, pools)):
        demote_ref(bf16[layer], src, ref, dst, codec)
        assert test_write._same(Int2Pages(mine.codes[layer], mine.scale[layer], mine.zero[layer]), ref), layer


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("which", list(TABLES))
@pytest.mark.parametrize("group", [64, 128])
def test_decode_levels_gpu(group, which):
    """Qwen3-8B attention shape, awkward lengths, the raw-code kernel (and page 48: the generic one)."""
    test_decode._check([1, 300, 20011, 0, 4097], 32, 8, 128, group=group, page=64, sink=64, recent=256, device="cuda",
                       levels=TABLES[which])
    test_decode._check([300, 4097], 32, 8, 128, group=group, page=48, sink=96, recent=256, device="cuda",
                       levels=TABLES[which])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("which", list(TABLES))
def test_extend_levels_gpu(which):
    test_extend._check([20011, 9000, 0], [1000, 2048, 300], 32, 8, 128, group=128, page=64, sink=64, recent=256,
                       device="cuda", levels=TABLES[which])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_prefill_levels_gpu():
    kv, tables, q, k_new, v_new, _, ref, tol = test_prefill._inputs([20011], [2048], 32, 8, 128, page=64, sink=64,
                                                                    recent=256, levels=(LM, LM))
    out = prefill_attention(q, k_new, v_new, kv, tables, 0, tables.lens()[0][:1] + tables.lens()[1][:1], 128**-0.5)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32 d, a, b, sel`` (default mode): byte k of d is byte ``sel`` nibble k (low 3 bits) of {b, a}."""
    src = (b << 32 | a).to_bytes(8, "little")
    return int.from_bytes(bytes(src[(sel >> 4 * k) & 7] for k in range(4)), "little")


@pytest.mark.parametrize("table", [LM, (0.0, 1.25, 1.875, 3.0), (0.0, 1.0, 2.0, 3.0), (0.0, 0.6093, 2.4, 3.0)])
def test_lut_slice_arithmetic(table):
    """The compiled kernels' level lookup (``kernels.levels._lut_slice``: its PTX emulated here instruction by
    instruction, on every code byte in every word position) gives ``_level_slice``'s fp16 levels for every slice.
    (The GPU tests run the real thing.)"""
    import numpy as np

    f16 = lambda x: int(np.array([x], np.float16).view(np.uint16)[0])  # noqa: E731
    for i in range(4):
        u = 2.0 ** (2 * i - 6)
        lo, hi = f16(table[1] * u) << 16, f16(table[2] * u) | ((((2 * i + 10) << 10) | 0x200) << 16)
        want = [np.float16(table[(byte >> 2 * i) & 3] * u) for byte in range(256)]
        for base in range(0, 256, 4):
            word = int.from_bytes(bytes((base + k * 65) % 256 for k in range(4)), "little")
            s = ((((word >> 2 * i) & 0x03030303) * 34) + 0x10101010) & 0xFFFFFFFF
            out = _prmt(lo, hi, s & 0xFFFF) | _prmt(lo, hi, s >> 16) << 32
            got = np.frombuffer(out.to_bytes(8, "little"), np.float16)
            assert [g for g in got] == [want[(base + k * 65) % 256] for k in range(4)]
