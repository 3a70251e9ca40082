"""The PyTorch oracles: written through ``write_ref`` and read back they equal dense attention
over the stored values (BF16 windows, dequantized INT2 history); demotion ≡ direct encoding."""

import math

import pytest
import torch

from oscarkv.cache.paged_layout import Int2Pages, LayerKV, PageTables
from oscarkv.kernels.reference import (decode_attention_ref, demote_ref, encode_ref, extend_attention_ref,
                                       rotate_ref, write_ref)
from oscarkv.quant.bpe import tiers
from oscarkv.quant.codec import TensorCodec
from oscarkv.quant.int2 import dequantize

P, SINK, RECENT = 4, 8, 8


def _codec(h: int, d: int, g: int, seed: int) -> TensorCodec:
    gen = torch.Generator().manual_seed(seed)
    rot = torch.linalg.qr(torch.randn(h, d, d, generator=gen))[0]
    return TensorCodec(2, g, rotation=rot, mean=torch.randn(h, d, generator=gen), clip=0.9)


def _pools(n: int, h: int, d: int, g: int) -> tuple[torch.Tensor, Int2Pages]:
    bf = torch.full((n, h, P, d), float("nan")).bfloat16()
    i2 = Int2Pages(torch.zeros(n, h, P, d // 4, dtype=torch.uint8), torch.full((n, h, P, d // g), float("nan")).half(),
                   torch.full((n, h, P, d // g), float("nan")).half())
    return bf, i2


def _write_sequence(x: torch.Tensor, codec: TensorCodec, bf: torch.Tensor, i2: Int2Pages, bf_pages, in_pages):
    """Store ``x [t, H, d]`` by tier; returns (bf16 slots, int2 slots, dense stored values [H, t, d])."""
    t = x.shape[0]
    tr = tiers(t, SINK, RECENT, P)
    hist = range(tr.sink, tr.sink + tr.history)
    bf_slots, in_slots, bi = [], [], 0
    for pos in range(t):
        if pos in hist:
            k = pos - tr.sink
            in_slots.append(in_pages[k // P] * P + k % P)
            bf_slots.append(-1)
        else:
            bf_slots.append(bf_pages[bi // P] * P + bi % P)
            in_slots.append(-1)
            bi += 1
    write_ref(x, codec, bf, torch.tensor(bf_slots), i2, torch.tensor(in_slots))
    rot = rotate_ref(x, codec)
    stored = rot.float().clone()
    if tr.history:
        stored[list(hist)] = dequantize(encode_ref(rot[list(hist)], codec), 2, codec.group)
    return tr, stored.transpose(0, 1)


def _dense(q, k, v, scale, mask=None):  # q [T, Hq, d], k/v [H, n, d]
    rep = q.shape[1] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    return torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1), k, v, attn_mask=mask, scale=scale).transpose(0, 1)


@pytest.mark.parametrize("lens,rep,d", [([5, 37], 4, 16), ([1, 8, 23], 1, 32), ([30], 8, 16)])
def test_decode_and_extend_ref_equal_dense_attention(lens, rep, d):
    h, g = 2, min(d, 16)
    codec = _codec(h, d, g, seed=len(lens))
    bf, i2 = _pools(64, h, d, g)
    free = list(torch.randperm(63) + 1)
    stored, bt, it = [], [], []
    for t in lens:
        tr = tiers(t, SINK, RECENT, P)
        nb = math.ceil(tr.sink / P) + math.ceil(tr.recent / P)
        bp = [int(free.pop()) for _ in range(nb)]
        ip = [int(free.pop()) for _ in range(tr.history // P)]
        x = torch.randn(t, h, d)
        _, s = _write_sequence(x, codec, bf, i2, bp, ip)
        stored.append(s)
        bt.append(bp)
        it.append(ip)
    pad = lambda rows: torch.tensor([r + [0] * (8 - len(r)) for r in rows], dtype=torch.int32)
    tables = PageTables(pad(bt), torch.tensor([sum(tiers(t, SINK, RECENT, P)[::2]) for t in lens], dtype=torch.int32),
                        pad(it), torch.tensor([tiers(t, SINK, RECENT, P).history for t in lens], dtype=torch.int32))
    kv = LayerKV(bf, bf.clone(), i2, i2)  # V pool = K values: enough to test the reading
    # decode
    q = torch.randn(len(lens), h * rep, d)
    out = decode_attention_ref(q, kv, tables, d**-0.5)
    for b, s in enumerate(stored):
        ref = _dense(q[b : b + 1], s, s, d**-0.5)[0]
        torch.testing.assert_close(out[b], ref, rtol=1e-5, atol=1e-5)
    # extend: chunks of 3 and 2 tokens after each cache
    cu = torch.tensor([0, *torch.cumsum(torch.tensor([3 if b % 2 == 0 else 2 for b in range(len(lens))]), 0)], dtype=torch.int32)
    qe, kn, vn = torch.randn(int(cu[-1]), h * rep, d), torch.randn(int(cu[-1]), h, d), torch.randn(int(cu[-1]), h, d)
    oe = extend_attention_ref(qe, kn, vn, kv, tables, cu, d**-0.5)
    for b, s in enumerate(stored):
        lo, hi = int(cu[b]), int(cu[b + 1])
        c, n = hi - lo, s.shape[1]
        mask = torch.cat([torch.ones(c, n, dtype=torch.bool), torch.ones(c, c, dtype=torch.bool).tril()], 1)
        k = torch.cat([s, kn[lo:hi].transpose(0, 1)], 1)
        v = torch.cat([s, vn[lo:hi].transpose(0, 1)], 1)
        torch.testing.assert_close(oe[lo:hi], _dense(qe[lo:hi], k, v, d**-0.5, mask), rtol=1e-5, atol=1e-5)


def test_demotion_equals_direct_encoding():
    h, d, g = 2, 32, 16
    codec = _codec(h, d, g, seed=7)
    bf, i2 = _pools(4, h, d, g)
    _, direct = _pools(4, h, d, g)
    x = torch.randn(P, h, d)
    slots = torch.arange(P) + P  # page 1
    write_ref(x, codec, bf, slots)
    demote_ref(bf, torch.tensor([1]), i2, torch.tensor([2]), codec)
    write_ref(x, codec, bf, torch.full((P,), -1), direct, slots + P)  # page 2 directly
    for f in ("codes", "scale", "zero"):
        assert torch.equal(getattr(i2, f)[2], getattr(direct, f)[2])
    assert torch.isnan(i2.scale[1]).all() and torch.isnan(i2.scale[3]).all()  # nothing else written
