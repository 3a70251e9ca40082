"""Decode attention kernel vs the fp32 oracle: awkward lengths, GQA 1/4/8, head_dim 64/128,
G < d, BF16-only caches, empty (padding) rows, 4-bit keys and/or values; CPU interpreter at small shapes, H100 at real ones."""

import pytest
import torch

from oscarkv.kernels.decode import decode_attention
from oscarkv.kernels.reference import decode_attention_ref, gather_sequence
from oscarkv.kernels.synthetic import random_cache

CUDA = torch.cuda.is_available()


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


def _bf16_torch_error(q, kv, tables, scale, ref):
    """‖bf16 PyTorch attention − fp32 oracle‖ / ‖oracle‖ over the same stored cache: the tolerance unit."""
    outs = []
    for b in range(q.shape[0]):
        k, v = gather_sequence(kv, tables, b)
        rep = q.shape[1] // k.shape[0]
        k, v = k.bfloat16().repeat_interleave(rep, 0), v.bfloat16().repeat_interleave(rep, 0)
        o = torch.nn.functional.scaled_dot_product_attention(q[b][:, None].bfloat16(), k, v, scale=scale)
        outs.append(o[:, 0])
    return _rel(torch.stack(outs), ref)


def _check(lens, hq, h, d, *, group=None, int2=True, page=16, sink=32, recent=64, splits=None, device="cpu", seed=0,
           bits=(2, 2), levels=(None, None), config=None):
    kv, tables = random_cache(lens, h, d, page=page, group=group, sink=sink, recent=recent, int2=int2,
                              device=device, seed=seed, bits=bits, levels=levels)
    gen = torch.Generator(device=device).manual_seed(seed + 99)
    q = torch.randn(len(lens), hq, d, generator=gen, device=device).bfloat16()
    # NOTE: on the CPU q is passed as fp32 (bf16 values) so the output stays fp32: Triton's
    # interpreter truncates fp32 → bf16 casts instead of rounding them.
    out = decode_attention(q if device == "cuda" else q.float(), kv, tables, d**-0.5, num_splits=splits,
                           config=config)
    ref = decode_attention_ref(q.float(), kv, tables, d**-0.5)
    assert torch.isfinite(out).all()
    live = torch.tensor([n > 0 for n in lens], device=device)
    assert (out[~live] == 0).all(), "a sequence with no token must output zeros"
    tol = 2 * _bf16_torch_error(q[live], kv, _subset(tables, live), d**-0.5, ref[live])
    assert _rel(out[live], ref[live]) <= max(tol, 1e-3), (_rel(out[live], ref[live]), tol)


def _subset(tables, keep):
    return type(tables)(*(t[keep] for t in (tables.bf16_table, tables.bf16_lens, tables.int2_table, tables.int2_lens)))


CPU_CASES = [  # (lens, Hq, H, d, group, int2, splits)
    ([5, 37, 131], 8, 2, 64, None, True, 3),  # inside the sink, inside the window, odd with history
    ([200, 1], 8, 1, 32, 16, True, 2),  # G < d (dequantized path), GQA 8
    ([77], 2, 2, 64, None, True, 1),  # GQA 1
    ([50, 3], 8, 2, 32, None, False, 4),  # BF16-only cache (the baseline kernel)
    ([0, 150], 4, 1, 32, None, True, None),  # a padding row next to a real one
    ([150, 99], 8, 2, 128, 64, True, 2),  # raw-code INT2 kernel with two groups per token
    ([403, 1], 8, 2, 128, None, True, 1),  # raw-code kernel, one split: several page-id chunks (CHUNK 4 here)
    ([300, 45], 8, 2, 64, None, True, 7),  # raw-code kernel: splits holding tiles of both tiers
    ([300], 4, 1, 64, None, True, 40),  # raw-code kernel: more splits than tiles (empty splits)
    ([2000], 4, 1, 64, None, True, 150),  # the merge loops over tiles of 64 splits (150: a partial last tile)
]


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("lens,hq,h,d,group,int2,splits", CPU_CASES)
def test_decode_matches_oracle_cpu(lens, hq, h, d, group, int2, splits):
    _check(lens, hq, h, d, group=group, int2=int2, splits=splits, seed=len(lens) + d)


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("lens,d,splits,cols", [([0, 150], 32, 3, 16),  # a padding row; 2 column programs
                                                ([2000, 70], 64, 150, 32),  # two unrolled tiles of 128 splits
                                                ([300], 64, 40, 64)])  # one program a row, empty splits
def test_column_merge_matches_oracle_cpu(lens, d, splits, cols):
    """The merge at other column widths per program (``MERGE_COLS``) = the oracle."""
    _check(lens, 4, 1, d, splits=splits, seed=len(lens) + d + cols, config={"MERGE_COLS": cols})


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("lens,splits,block,bits", [
    ([403, 1], 1, 64, (2, 2)),  # one split: full tiles of 4 pages across page-id chunks, then a tail page by page
    ([300, 45], 7, 32, (2, 2)),  # splits holding tiles of both tiers, tiles of 2 pages
    ([300], 40, 64, (2, 2)),  # more splits than tiles (empty splits)
    ([530, 77], 3, 64, (4, 2)),  # 4-bit keys (the shipped recipe's 4-bit heads)
])
def test_tiles_of_several_pages_match_oracle_cpu(lens, splits, block, bits):
    """Pages of 16 read in tiles of several pages (``SPAN_PAGES``; sink 16, recent 16 as the shipped recipe's
    windows; INT2 lengths not multiples of the tile: the tail goes page by page) = the oracle."""
    _check(lens, 8, 2, 64, splits=splits, seed=len(lens) + block + bits[0], sink=16, recent=16, bits=bits,
           config={"BLOCK_N": block, "SPAN_PAGES": True, "CHUNK": 4})


RUNG_CASES = [  # (lens, Hq, H, d, group, splits): the generic kernel (G < d), the raw-code kernel (1 and 2 groups)
    ([200, 1], 8, 1, 32, 16, 2),
    ([300, 45], 8, 2, 64, None, 7),
    ([150, 99], 8, 2, 128, 64, 2),
]


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("bits", [(4, 2), (2, 4), (4, 4)], ids=["k4v2", "k2v4", "int4"])
@pytest.mark.parametrize("lens,hq,h,d,group,splits", RUNG_CASES)
def test_decode_rungs_match_oracle_cpu(lens, hq, h, d, group, splits, bits):
    """4-bit keys and/or values (two INT2 planes) through both decode kernels."""
    _check(lens, hq, h, d, group=group, splits=splits, seed=len(lens) + d + bits[0], bits=bits)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("bits", [(4, 2), (2, 4), (4, 4)], ids=["k4v2", "k2v4", "int4"])
@pytest.mark.parametrize("group", [64, 128])
def test_decode_rungs_gpu(bits, group):
    _check([1, 300, 20011, 0, 4097], 32, 8, 128, group=group, page=64, sink=64, recent=256, device="cuda", bits=bits)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rep", [1, 4, 8])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("int2", [True, False])
def test_decode_matches_oracle_gpu(rep, d, int2):
    lens = [1, 63, 300, 4097, 20011, 0, 65]
    _check(lens, 8 * rep // 2, 4, d, int2=int2, page=64, sink=64, recent=256, device="cuda", seed=rep * d)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_decode_real_shape_gpu():
    """Qwen3-8B attention shape, 32K context, batch 4, G = 64 and G = 128."""
    for group in (64, 128):
        _check([32768, 32001, 16385, 9000], 32, 8, 128, group=group, page=64, sink=64, recent=256, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("bits", [(2, 2), (4, 2)], ids=["int2", "k4v2"])
def test_pages_of_16_match_oracle_gpu(block, bits):
    """Pages of 16 with the shipped recipe's windows (sink 16, recent 16): tiles of one page (16) or of several
    (``SPAN_PAGES``: 32, 64), at the Qwen3-8B attention shape."""
    _check([1, 63, 300, 20011, 0, 4097], 32, 8, 128, group=128, page=16, sink=16, recent=16, device="cuda",
           bits=bits, config={"BLOCK_N": block, "SPAN_PAGES": True}, seed=block + bits[0])


def test_out_dtype_is_the_rounded_output():
    """``out_dtype=bf16`` with fp32 queries (an OSCAR step's mapped q) = the fp32 output rounded: the merge
    rounds in-kernel (nearest even on CUDA; the CPU interpreter truncates, so one bf16 ulp there)."""
    dev = "cuda" if CUDA else "cpu"
    kv, tables = random_cache([150, 40], 2, 64, page=16, group=None, sink=32, recent=64, device=dev, seed=3)
    q = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(4)).to(dev)
    full = decode_attention(q, kv, tables, 0.125, num_splits=2)
    half = decode_attention(q, kv, tables, 0.125, num_splits=2, out_dtype=torch.bfloat16)
    assert full.dtype == torch.float32 and half.dtype == torch.bfloat16
    if CUDA:
        assert torch.equal(half, full.bfloat16())
    else:
        torch.testing.assert_close(half.float(), full, rtol=2**-7, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("bits", [(2, 2), (2, 4)], ids=["int2", "k2v4"])
def test_long_splits_keep_accuracy_gpu(bits):
    """Two splits of 25K INT2 tokens are as close to the oracle as 64 short ones: each tile's value products are
    summed apart from the running output (``decode_int2._add_tile``); chained through the MMAs the output drifted
    with the split's length (6% at two splits of 100K, H200)."""
    kv, tables = random_cache([50000], 8, 128, page=64, group=128, sink=64, recent=256, device="cuda", bits=bits,
                              seed=3)
    q = torch.randn(1, 32, 128, generator=torch.Generator(device="cuda").manual_seed(4), device="cuda").bfloat16()
    ref = decode_attention_ref(q.float(), kv, tables, 128**-0.5)
    errs = [_rel(decode_attention(q, kv, tables, 128**-0.5, num_splits=s), ref) for s in (2, 64)]
    assert errs[0] <= 1.5 * errs[1], errs
