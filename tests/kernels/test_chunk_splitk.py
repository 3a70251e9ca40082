"""Split-K chunk attention (``oscarkv.kernels.chunk_splitk``) vs the fp32 oracle: odd chunk lengths and one-token
chunks in one batch, GQA 1/4/6, head_dim 64/128 with one or two groups per token, BF16-only caches, an empty
cache, prefixes that split unevenly (more splits than tiles), every precision rung (K4/V4, level tables); and
``TritonAttention.extend`` routing a step by shape. CPU interpreter at small shapes, GPU at real ones."""

import pytest
import torch

from oscarkv.attention.backends import TritonAttention
from oscarkv.kernels.chunk_splitk import chunk_attention, prefers_splitk, serves
from oscarkv.kernels.reference import extend_attention_ref
from oscarkv.kernels.synthetic import random_cache
from tests.kernels.test_extend import _bf16_error, _rel, as_views

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
LM = (0.0, 0.8125, 2.1875, 3.0)  # a Lloyd-Max-like 2-bit table (fp16 values)


def _check(cached, chunks, hq, h, d, *, group=None, int2=True, page=16, sink=32, recent=64, splits=None, seed=0,
           bits=(2, 2), levels=(None, None), config=None, views=False):
    kv, tables = random_cache(cached, h, d, page=page, group=group, sink=sink, recent=recent, int2=int2,
                              device=DEV, seed=seed, bits=bits, levels=levels)
    assert serves(kv)
    gen = torch.Generator(device=DEV).manual_seed(seed + 5)
    t = sum(chunks)
    q, k_new, v_new = (torch.randn(t, n, d, generator=gen, device=DEV).bfloat16() for n in (hq, h, h))
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    # NOTE: fp32 (bf16 values) in the interpreter, which truncates fp32 → bf16 casts
    cast = (lambda x: x) if CUDA else (lambda x: x.float())
    args = (cast(q), cast(k_new), cast(v_new))
    out = chunk_attention(*(as_views(*args) if views else args), kv, tables, cu, d**-0.5, max(chunks),
                          num_splits=splits, config=config)
    ref = extend_attention_ref(q.float(), k_new, v_new, kv, tables, cu, d**-0.5)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    tol = max(2 * _bf16_error(q, k_new, v_new, kv, tables, cu, d**-0.5, ref), 1e-3)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


CPU_CASES = [  # (cached lens, chunk lens, Hq, H, d, group, int2, splits)
    ([300, 45], [7, 1], 8, 2, 64, None, True, 3),  # windows + history; an odd chunk next to a one-token one
    ([200], [5], 6, 1, 64, None, True, 2),  # GQA 6 (REP_PAD 8): dead head rows
    ([150, 0], [3, 9], 8, 2, 128, 64, True, 2),  # two groups per token; an empty cache (the chunk only)
    ([99], [11], 4, 4, 64, None, False, 3),  # BF16-only cache, GQA 1
    ([130], [13], 8, 2, 64, None, True, 9),  # more splits than tiles: empty splits, -inf in the merge
    ([403], [21], 8, 2, 64, None, True, 2),  # several row blocks (BLOCK_T = 4) and several page-id chunks
]


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("cached,chunks,hq,h,d,group,int2,splits", CPU_CASES)
def test_chunk_matches_oracle_cpu(cached, chunks, hq, h, d, group, int2, splits):
    _check(cached, chunks, hq, h, d, group=group, int2=int2, splits=splits, seed=sum(cached) + d)


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("bits,levels", [((4, 2), (None, None)), ((2, 4), (None, None)), ((4, 4), (None, None)),
                                         ((2, 2), (LM, LM)), ((2, 2), (None, LM))],
                         ids=["k4v2", "k2v4", "int4", "levels", "value-levels"])
def test_chunk_rungs_cpu(bits, levels):
    _check([230, 17], [6, 2], 8, 2, 64, splits=3, seed=bits[0] + 3 * bits[1], bits=bits, levels=levels)


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("d,group", [(64, None), (128, 64)])
def test_chunk_reads_strided_views_cpu(d, group):
    """q, k and v as views with different row strides (``test_extend.as_views``: the fused maps' q/k buffer and the
    projection's v), read in place; one and two groups per token."""
    _check([300, 45], [7, 1], 8, 2, d, group=group, splits=3, seed=d, views=True)


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
def test_chunk_rows_of_128_cpu():
    """128 query rows per program (32 chunk tokens x a GQA group of 4: what ``chunk_sweep --rows`` times for
    64-token follow-ups), a chunk of 40 over two row blocks, the second one partly dead."""
    _check([300], [40], 8, 2, 64, splits=2, seed=3, config={"ROWS": 128, "CHUNK": 4})


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("bits", [(2, 2), (4, 2)], ids=["int2", "k4v2"])
def test_chunk_tiles_of_several_pages_cpu(bits):
    """Pages of 16 (sink and recent 16, the shipped recipe's windows) in tiles of four pages (``SPAN_PAGES``):
    INT2 lengths not multiples of the tile, so each history ends page by page."""
    _check([403, 150], [5, 2], 8, 2, 64, sink=16, recent=16, splits=2, seed=bits[0] + 11, bits=bits,
           config={"BLOCK_N": 64, "SPAN_PAGES": True, "CHUNK": 4})


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
def test_chunk_rung_two_groups_cpu():
    """4-bit values and a key level table with two groups per token (each group's high plane and table)."""
    _check([150], [5], 8, 2, 128, group=64, splits=2, seed=9, bits=(2, 4), levels=(LM, None))


def test_shape_table():
    """Short chunks over long prefixes take the kernel (up to 32 tokens, either cache kind: every verify chunk of
    K <= 31 drafts; up to 64 over INT2 history of 16K, in an extend graph); longer chunks (the staged path, its keys in
    spans) and short prefixes do not."""
    assert prefers_splitk(1, 100_000, True) and prefers_splitk(32, 100_000, True) and prefers_splitk(32, 100_000, False)
    assert not prefers_splitk(33, 100_000, False) and prefers_splitk(64, 100_000, True)
    assert not prefers_splitk(65, 100_000, True) and not prefers_splitk(33, 6144, True)
    assert not prefers_splitk(8, 0, False) and not prefers_splitk(16, 1000, True)
    for rows in range(1, 33):  # a verify chunk of K = 8 is 9 rows: split-K, not 9 decode rows or the staged path
        assert all(prefers_splitk(rows, ctx, int2) for ctx in (1024, 6144, 32768, 102400) for int2 in (False, True))


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
def test_triton_backend_routes_by_shape(monkeypatch):
    """One step, three paths: a short chunk over a long prefix to split-K, a long chunk to the staged path, a
    short chunk over a short prefix to the tile kernel; the whole step matches the oracle."""
    from oscarkv.kernels import chunk_splitk, prefill

    monkeypatch.setattr(chunk_splitk, "SPLITK_SHAPES", {"bf16": ((16, 200),), "int2": ((16, 200),)})
    monkeypatch.setattr(prefill, "MIN_CHUNK", 24)
    chunks, cached = [9, 30, 4], [260, 100, 50]
    kv, tables = random_cache(cached, 2, 64, page=16, sink=32, recent=64, seed=4)
    gen = torch.Generator().manual_seed(4)
    q, k_new, v_new = (torch.randn(sum(chunks), n, 64, generator=gen).bfloat16().float() for n in (8, 2, 2))
    cu = torch.tensor([0, 9, 39, 43], dtype=torch.int32)
    calls = []
    monkeypatch.setattr(chunk_splitk, "chunk_attention", _spy(chunk_splitk.chunk_attention, calls, "splitk"))
    out = TritonAttention().extend(q, k_new, v_new, kv, tables, cu, 0.125)
    ref = extend_attention_ref(q, k_new, v_new, kv, tables, cu, 0.125)
    assert calls == [("splitk", 9)]
    assert _rel(out, ref) <= max(2 * _bf16_error(q, k_new, v_new, kv, tables, cu, 0.125, ref), 1e-3)


def _spy(fn, calls, name):
    def wrapped(q, *args, **kwargs):
        calls.append((name, q.shape[0]))
        return fn(q, *args, **kwargs)
    return wrapped


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("chunks", [[1], [8], [64], [3, 1, 17]], ids=str)
@pytest.mark.parametrize("kind", ["int2", "bf16", "k4v2", "levels"])
def test_chunk_real_shape_gpu(chunks, kind):
    """Qwen3-4B/8B attention shape (32 query heads, 8 KV heads, d = 128, page 64) over prefixes of up to 20K
    tokens that split unevenly, one to three sequences; chunks up to ``MAX_CHUNK``, the longest the engine routes
    here."""
    cached = [20011, 9000, 300][: len(chunks)]
    opts = dict(int2=kind != "bf16", bits=(4, 2) if kind == "k4v2" else (2, 2),
                levels=(LM, LM) if kind == "levels" else (None, None))
    _check(cached, chunks, 32, 8, 128, group=128, page=64, sink=64, recent=256, seed=len(chunks), **opts)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_chunk_gqa_gpu():
    """GQA 5 (Qwen3-14B: 40 query heads, REP_PAD 8) and GQA 1, 64-channel groups (two per token)."""
    _check([30001], [37], 40, 8, 128, group=128, page=64, sink=64, recent=256, seed=1)
    _check([12345], [9], 8, 8, 128, group=64, page=64, sink=64, recent=256, seed=2)
