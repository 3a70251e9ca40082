"""Long-chunk prefill attention (``oscarkv.kernels.prefill``) vs the fp32 oracle: the prefix staged in
segments (several per sequence, split inside the BF16 and the INT2 tier), GQA groups 1/4/6, BF16-only
caches, an empty cache, 4-bit keys and/or values; and ``TritonAttention.extend`` routing a mixed batch (long chunks here, short
ones to the tile kernel). CPU (interpreter gather, fp32 attention) at small shapes, GPU (cuDNN) at real ones."""

import pytest
import torch
import triton

from oscarkv.attention.backends import TritonAttention
from oscarkv.kernels import prefill
from oscarkv.kernels.prefill import MIN_CHUNK, prefill_attention
from oscarkv.kernels.reference import extend_attention_ref
from oscarkv.kernels.synthetic import random_cache
from tests.kernels.test_extend import _bf16_error, _rel

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _inputs(cached, chunks, hq, h, d, *, group=None, int2=True, page=16, sink=32, recent=64, seed=0, bits=(2, 2), levels=(None, None)):
    kv, tables = random_cache(cached, h, d, page=page, group=group, sink=sink, recent=recent, int2=int2,
                              device=DEV, seed=seed, bits=bits, levels=levels)
    gen = torch.Generator(device=DEV).manual_seed(seed + 11)
    t = sum(chunks)
    q, k_new, v_new = (torch.randn(t, n, d, generator=gen, device=DEV).bfloat16().float() for n in (hq, h, h))
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    ref = extend_attention_ref(q, k_new, v_new, kv, tables, cu, d**-0.5)
    tol = max(2 * _bf16_error(q, k_new, v_new, kv, tables, cu, d**-0.5, ref), 1e-3)
    return kv, tables, q, k_new, v_new, cu, ref, tol


CASES = [  # (cached, chunk, Hq, H, d, group, int2, segment)
    (150, 40, 8, 2, 64, None, True, 48),  # 3 segments: BF16 tokens, then a split inside the INT2 history
    (300, 33, 6, 1, 32, 16, True, None),  # GQA 6, G < d, one segment
    (0, 29, 4, 4, 32, None, True, None),  # first chunk: no cached token, only the causal part
    (99, 17, 12, 1, 32, None, False, 32),  # BF16-only cache, GQA 12, segments split the BF16 tier
]


@pytest.mark.parametrize("cached,chunk,hq,h,d,group,int2,segment", CASES)
def test_prefill_matches_oracle(cached, chunk, hq, h, d, group, int2, segment):
    kv, tables, q, k_new, v_new, _, ref, tol = _inputs([cached], [chunk], hq, h, d, group=group, int2=int2, seed=cached)
    out = prefill_attention(q, k_new, v_new, kv, tables, 0, tables.lens()[0][:1] + tables.lens()[1][:1], d**-0.5,
                            segment=segment)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


@pytest.mark.parametrize("cached,chunk,hq,h,d,group,int2,segment", CASES[:2] + CASES[3:] + [(300, 150, 8, 2, 32, None, True, 96)])
def test_cuda_shapes_match_oracle(monkeypatch, cached, chunk, hq, h, d, group, int2, segment):
    """cuDNN builds a graph per shape, so on a GPU the prefix keys are padded (zero keys and values) to a few
    lengths and the merge sheds their weight, cuDNN's rows and the causal part are padded, few rows take
    FlashAttention's entry: forced on the CPU (the last case's 600 stacked rows take cuDNN's), the oracle holds."""
    monkeypatch.setattr(prefill, "CUDA_SHAPES", True)
    kv, tables, q, k_new, v_new, _, ref, tol = _inputs([cached], [chunk], hq, h, d, group=group, int2=int2, seed=cached)
    out = prefill_attention(q, k_new, v_new, kv, tables, 0, tables.lens()[0][:1] + tables.lens()[1][:1], d**-0.5,
                            segment=segment)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


@pytest.mark.parametrize("spans", [2, 4])
@pytest.mark.parametrize("cached,chunk,hq,h,d,group,int2,segment", [CASES[0], CASES[1], CASES[3]])
def test_key_spans_match_oracle(monkeypatch, spans, cached, chunk, hq, h, d, group, int2, segment):
    """The prefix call with its keys cut into spans (``KEY_SPANS``, the call's batch; on a GPU when few rows would
    leave SMs idle), every segment's spans merged with the other parts, zero-key padding filling whole spans: the
    oracle holds."""
    monkeypatch.setattr(prefill, "CUDA_SHAPES", True)
    monkeypatch.setattr(prefill, "KEY_SPANS", spans)
    calls, attend = [], prefill._attend_lse
    monkeypatch.setattr(prefill, "_attend_lse", lambda q, k, v, causal, scale: calls.append(
        (causal, q.shape[0], k.shape[0])) or attend(q, k, v, causal, scale))
    kv, tables, q, k_new, v_new, _, ref, tol = _inputs([cached], [chunk], hq, h, d, group=group, int2=int2, seed=cached)
    out = prefill_attention(q, k_new, v_new, kv, tables, 0, tables.lens()[0][:1] + tables.lens()[1][:1], d**-0.5,
                            segment=segment)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)
    assert {(b, n) for c, b, n in calls if not c} == {(spans, spans)} and any(c for c, _, _ in calls)


def test_key_spans_fill_the_sms():
    """Spans by shape (132 SMs, 8 KV heads): the counts that timed best (``KEY_SPANS``), none where the rows fill the
    GPU, and spans of at least ``SPAN_MIN_KEYS`` keys."""
    assert [prefill.key_spans(rows, 102400, 8, 132) for rows in (64, 256, 1024, 2048)] == [16, 16, 4, 1]
    assert [prefill.key_spans(rows, 32768, 8, 132) for rows in (256, 1024)] == [8, 4]
    assert prefill.key_spans(256, 8191, 8, 132) == 1 and prefill.key_spans(256, 8192, 8, 132) == 2


def test_a_cold_prompt_meets_only_warmed_shapes(monkeypatch):
    """``warm_cudnn`` builds at start-up what a cold prompt's full chunks then meet: every attention call of a
    4-chunk prompt (600 stacked rows each: cuDNN's side of ``FLASH_ROWS``; segments of 256 keys) is a listed shape."""
    monkeypatch.setattr(prefill, "CUDA_SHAPES", True)
    seen, attend = [], prefill._attend_lse
    monkeypatch.setattr(prefill, "_attend_lse", lambda q, k, v, causal, scale: seen.append(
        (causal, q.shape[2], k.shape[2])) or attend(q, k, v, causal, scale))
    chunk, seg = 150, 256
    for i in range(4):
        kv, tables, q, k_new, v_new, _, _, _ = _inputs([i * chunk], [chunk], 8, 2, 32, seed=i)
        prefill_attention(q, k_new, v_new, kv, tables, 0, tables.lens()[0][:1] + tables.lens()[1][:1], 32**-0.5,
                          segment=seg)
    prefix, causal = prefill.cold_prompt_shapes(4, chunk, 4 * chunk, seg)
    assert {(rows, n) for c, rows, n in seen if not c} == set(prefix)
    assert {rows for c, rows, _ in seen if c} <= set(causal) and len(causal) == 3
    # a long chunk: last chunks up to WARM_LAST_CHUNKS and the full one (its 128 lengths took 6 s of start-up)
    assert prefill.cold_prompt_shapes(4, 8192, 8192, seg)[1] == [*range(64, 513, 64), 8192]


def test_warm_cudnn_builds_every_listed_shape_for_any_chunk(monkeypatch):
    """``warm_cudnn`` runs every shape :func:`cold_prompt_shapes` lists, for a chunk that is no multiple of
    ``CAUSAL_STEP`` too (48 tokens: causal parts padded to 64; its buffer once held only 48 keys and failed)."""
    monkeypatch.setattr(prefill, "CUDA_SHAPES", True)
    seen, attend = [], prefill._attend_lse
    monkeypatch.setattr(prefill, "_attend_lse", lambda q, k, v, causal, scale: seen.append(
        (causal, q.shape[2], k.shape[2])) or attend(q, k, v, causal, scale))
    for chunk in (48, 300):
        seen.clear()
        n = prefill.warm_cudnn((8, 2, 32, 16), chunk, 2000, 32**-0.5, torch.device("cpu"))
        prefix, causal = prefill.cold_prompt_shapes(4, chunk, 2000, prefill._segment_tokens(2, 32, 16))
        assert n == len(seen) == len(prefix) + len(causal)
        assert {(r, k) for c, r, k in seen if not c} == set(prefix) and [r for c, r, _ in seen if c] == causal


def test_key_buckets_are_few_and_tight():
    lengths = {prefill._key_bucket(n) for n in range(1, 131073)}
    assert len(lengths) <= 8 + 8 * 5  # 512 apart below 4096, then 8 an octave up to 128K
    for n in (1, 511, 513, 4097, 33280, 102912, 131072):
        assert n <= prefill._key_bucket(n) < max(n + 512, n * 9 // 8 + 1)


def test_the_merge_sheds_zero_key_padding():
    """Two parts (one over keys padded with 24 zero keys and values, ``_Part.pad``) merge into the attention over the
    real keys alone."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 8, generator=g)
    k1, v1, k2, v2 = (torch.randn(1, 2, n, 8, generator=g) for n in (40, 40, 7, 7))
    zeros = torch.zeros(1, 2, 24, 8)
    from oscarkv.kernels import lse_merge

    a = lse_merge.headed(*prefill._attend_lse(q, torch.cat([k1, zeros], 2), torch.cat([v1, zeros], 2), False, 0.3), 1)
    b = lse_merge.headed(*prefill._attend_lse(q, k2, v2, False, 0.3), 1)
    got = lse_merge.merge([lse_merge._Part(a.o, a.lse, a.o_strides, a.lse_strides, 24), b], 5, 2, 1)
    want, _ = prefill._attend_lse(q, torch.cat([k1, k2], 2), torch.cat([v1, v2], 2), False, 0.3)
    torch.testing.assert_close(got, want[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits", [(4, 2), (2, 4), (4, 4)], ids=["k4v2", "k2v4", "int4"])
@pytest.mark.parametrize("group", [None, 16])
def test_prefill_rungs_match_oracle(bits, group):
    """4-bit keys and/or values staged from their two INT2 planes (segments split the history)."""
    kv, tables, q, k_new, v_new, _, ref, tol = _inputs([150], [40], 8, 2, 32, group=group, seed=bits[0], bits=bits)
    out = prefill_attention(q, k_new, v_new, kv, tables, 0, tables.lens()[0][:1] + tables.lens()[1][:1], 32**-0.5,
                            segment=48)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


def test_triton_backend_routes_mixed_batch():
    """Long chunks to the staged path, one-token and short ones to the tile kernel, in one step."""
    chunks = [MIN_CHUNK + 3, 1, 5]
    kv, tables, q, k_new, v_new, cu, ref, tol = _inputs([130, 210, 0], chunks, 8, 2, 32, seed=3)
    out = TritonAttention().extend(q, k_new, v_new, kv, tables, cu, 32**-0.5)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


def test_triton_backend_one_long_chunk():
    """One sequence's long chunk alone (a prompt chunk, a follow-up): the staged path's output is the step's."""
    kv, tables, q, k_new, v_new, cu, ref, tol = _inputs([150], [MIN_CHUNK + 9], 8, 2, 32, seed=4)
    out = TritonAttention().extend(q, k_new, v_new, kv, tables, cu, 32**-0.5)
    assert out.dtype == torch.float32 and out.shape == q.shape and _rel(out, ref) <= tol, (_rel(out, ref), tol)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("bits", [(4, 2), (2, 4), (4, 4)], ids=["k4v2", "k2v4", "int4"])
def test_prefill_rungs_gpu(bits):
    kv, tables, q, k_new, v_new, cu, ref, tol = _inputs([20011, 9000, 0], [1000, 2048, 300], 32, 8, 128, group=128,
                                                        page=64, sink=64, recent=256, seed=6, bits=bits)
    out = TritonAttention().extend(q, k_new, v_new, kv, tables, cu, 128**-0.5)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_prefill_few_rows_flash_gpu():
    """Chunks of 64-128 tokens at GQA 4 (up to ``FLASH_ROWS`` stacked rows: FlashAttention-2) and one of 200 (cuDNN,
    its keys padded to a bucket), causal parts padded to ``CAUSAL_STEP``."""
    kv, tables, q, k_new, v_new, cu, ref, tol = _inputs([33001, 9000, 4097, 20011], [64, 100, 128, 200], 32, 8, 128,
                                                        group=128, page=64, sink=64, recent=256, seed=7)
    out = TritonAttention().extend(q, k_new, v_new, kv, tables, cu, 128**-0.5)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("int2", [True, False])
def test_prefill_real_shape_gpu(int2):
    """Qwen3-8B attention shape, three sequences in one step (two segments for the first)."""
    kv, tables, q, k_new, v_new, cu, ref, tol = _inputs([20011, 9000, 0], [1000, 2048, 300], 32, 8, 128, group=128,
                                                        int2=int2, page=64, sink=64, recent=256, seed=5)
    out = TritonAttention().extend(q, k_new, v_new, kv, tables, cu, 128**-0.5)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)
    out = prefill_attention(q[:1000], k_new[:1000], v_new[:1000], kv, tables, 0,
                            (tables.lens()[0][0], tables.lens()[1][0]), 128**-0.5, segment=8192)
    assert _rel(out, ref[:1000]) <= tol


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("int2", [True, False])
def test_prefill_key_spans_gpu(int2):
    """64 and 256 new tokens over a 100K prefix (Qwen3-8B attention shape): the prefix call's keys cut into spans
    (``key_spans``: 16 and 4 on 132 SMs) hold the oracle."""
    for chunk in (64, 256):
        kv, tables, q, k_new, v_new, cu, ref, tol = _inputs([102400], [chunk], 32, 8, 128, group=128, int2=int2,
                                                            page=64, sink=64, recent=256, seed=chunk)
        assert prefill._spans(q.new_empty(1, 8, 4 * chunk, 1), prefill._key_bucket(102400)) > 1
        out = prefill_attention(q, k_new, v_new, kv, tables, 0, (tables.lens()[0][0], tables.lens()[1][0]), 128**-0.5)
        assert _rel(out, ref) <= tol, (chunk, _rel(out, ref), tol)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_warm_cudnn_gpu():
    """The start-up builds run on a GPU at the Qwen3-8B attention shape (prompts up to 16K: 24 prefix and 8 causal
    shapes)."""
    prefix, causal = prefill.cold_prompt_shapes(4, 512, 16384, prefill._segment_tokens(8, 128, 64))
    assert prefill.warm_cudnn((32, 8, 128, 64), 512, 16384, 128**-0.5, torch.device("cuda")) == len(prefix) + len(causal)



@pytest.mark.parametrize("d,group", [(64, 64), (128, 64), (128, 128)])
def test_raw_gather_equals_dequant(monkeypatch, d, group):
    """The INT2 gather slice by slice (``_raw_rows``, the layouts the raw-code decode kernel reads) writes the same
    bits as ``extend._dequant`` element by element, over a span that starts and ends inside pages; ``raw_gather``
    picks it for these layouts once ``RAW_GATHER`` is set."""
    from oscarkv.kernels.pools import format_args, history_arg

    kv, tables = random_cache([700], 2, d, page=16, group=group, sink=32, recent=64, device=DEV, seed=d + group)
    n = tables.lens()[1][0]
    outs = []
    for raw in ({}, {"RAW": True, "CONV": 2 if CUDA else 0}):
        k = torch.full((1, 2, n, d), 7.0, dtype=torch.bfloat16 if CUDA else torch.float32, device=DEV)
        v = torch.full_like(k, 7.0)
        prefill._gather_int2_kernel[(triton.cdiv(n - 21, 32), 2)](
            history_arg(kv), tables.int2_table[0], (k, v, k.stride(1)), (5, n - 21, 3), D=d, G=group, P=16, BLOCK=32,
            num_warps=4, **format_args(kv), **raw)
        outs.append((k, v))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert (outs[1][0][:, :, 3:3 + n - 21] != 7.0).any() and (outs[1][0][:, :, n - 18:] == 7.0).all()
    monkeypatch.setattr(prefill, "RAW_GATHER", {"BLOCK": 32, "num_warps": 4})
    assert prefill.raw_gather(kv, CUDA)[2] and not prefill.raw_gather(random_cache([700], 2, d, page=16, group=group,
                                                                                  bits=(4, 2), device=DEV)[0], CUDA)[2]
