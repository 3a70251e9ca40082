"""A per-head key allocation serves each layer as head ranges (``KVPools.parts``): the kernels read a range's BF16
pages as a strided view of the layer's pool (its heads only) beside the range's own history pages. Every kernel
route on such a view ≡ the fp32 oracle on the same view, and the oracle on a view ≡ the oracle on the whole layer
restricted to those heads (to fp32 rounding). CPU interpreter at small shapes; on a GPU at a real head_dim."""

from dataclasses import replace

import pytest
import torch

from oscarkv.attention.backends import TritonAttention
from oscarkv.cache.paged_layout import Int2Pages, LayerKV
from oscarkv.kernels.decode import decode_attention
from oscarkv.kernels.prefill import MIN_CHUNK
from oscarkv.kernels.reference import decode_attention_ref, extend_attention_ref
from oscarkv.kernels.synthetic import random_cache
from tests.kernels.test_decode import _bf16_torch_error, _rel
from tests.kernels.test_extend import _bf16_error

CUDA = torch.cuda.is_available()


def _range(kv: LayerKV, lo: int, hi: int) -> LayerKV:
    """Heads ``[lo, hi)``: strided BF16 views, history pages copied into tensors of their own (as the pools hold)."""
    def own(p: Int2Pages) -> Int2Pages:
        return replace(p, **{f: getattr(p, f)[:, lo:hi].contiguous() for f in ("codes", "scale", "zero")})
    return LayerKV(kv.bf16_k[:, lo:hi], kv.bf16_v[:, lo:hi], own(kv.int2_k), own(kv.int2_v))


def _case(device: str, d: int, rep: int, seed: int, lo: int = 1):
    page, sink, recent = (64, 64, 256) if device == "cuda" else (16, 32, 64)
    kv, tables = random_cache([300, 90], 3, d, page=page, sink=sink, recent=recent, device=device, seed=seed,
                              bits=(4, 2))
    part = _range(kv, lo, 3)
    assert not part.bf16_k.is_contiguous()
    return kv, part, tables, rep


@pytest.mark.parametrize("rep", [1, 2])
def test_oracle_on_a_range_is_the_layer_restricted(rep):
    kv, part, tables, _ = _case("cpu", 32, rep, seed=rep)
    q = torch.randn(2, 3 * rep, 32, generator=torch.Generator().manual_seed(rep))
    whole = decode_attention_ref(q, kv, tables, 32**-0.5)
    torch.testing.assert_close(decode_attention_ref(q[:, rep:], part, tables, 32**-0.5), whole[:, rep:], rtol=1e-5, atol=1e-6)


def _check_routes(device: str, d: int, rep: int, seed: int, lo: int = 1) -> None:
    """Heads ``[lo, 3)``; ``lo = 2``: a one-head range whose K comes from a head-major layout (``to_rotated``'s
    ``[H, T, d]`` product viewed as ``[T, H, d]``) and V from a token-major one: strides differ where the head
    dimension has length 1."""
    _, part, tables, _ = _case(device, d, rep, seed, lo)
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(2, 3 * rep, d, generator=gen, device=device).bfloat16()[:, lo * rep:]  # the range's query heads
    out = decode_attention(q if device == "cuda" else q.float(), part, tables, d**-0.5)
    ref = decode_attention_ref(q.float(), part, tables, d**-0.5)
    assert _rel(out, ref) <= max(2 * _bf16_torch_error(q, part, tables, d**-0.5, ref), 1e-3)
    for chunks in ([3, 5], [MIN_CHUNK, 2]):  # the tile / split-K kernels, the staged path
        t = sum(chunks)
        qe, v = (torch.randn(t, 3 * n, d, generator=gen, device=device).bfloat16().float() for n in (rep, 1))
        k = torch.randn(3, t, d, generator=gen, device=device).bfloat16().float().transpose(0, 1)  # [T, H, d] view
        qe, k, v = qe[:, lo * rep:], k[:, lo:], v[:, lo:]
        cu = torch.tensor([0, chunks[0], t], dtype=torch.int32, device=device)
        out = TritonAttention().extend(qe, k, v, part, tables, cu, d**-0.5)
        ref = extend_attention_ref(qe, k, v, part, tables, cu, d**-0.5)
        assert _rel(out, ref) <= max(2 * _bf16_error(qe, k, v, part, tables, cu, d**-0.5, ref), 1e-3), chunks


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("lo", [1, 2])
def test_kernels_read_a_head_range_cpu(lo):
    _check_routes("cpu", 32, 2, seed=3, lo=lo)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rep", [1, 4])
@pytest.mark.parametrize("lo", [1, 2])
def test_kernels_read_a_head_range_gpu(rep, lo):
    _check_routes("cuda", 128, rep, seed=rep, lo=lo)


def _split_view(device: str, d: int, seed: int):
    """A layer of 3 KV heads split at head 1: head 0's history at 2/2 bits, heads 1-2 at 4/2 (a per-head key
    allocation as ``KVPools.layer`` views it), with the two ranges' views for the oracle."""
    from oscarkv.cache.paged_layout import HeadSplit

    page, sink, recent = (64, 64, 256) if device == "cuda" else (16, 32, 64)
    common = dict(page=page, sink=sink, recent=recent, device=device, seed=seed)
    low, tables = random_cache([300, 90], 3, d, bits=(2, 2), **common)
    high, _ = random_cache([300, 90], 3, d, bits=(4, 2), **common)  # same pages and BF16 rows (same seed)
    assert torch.equal(low.bf16_k[1:], high.bf16_k[1:])
    first, second = _range(low, 0, 1), _range(high, 1, 3)
    whole = LayerKV(low.bf16_k, low.bf16_v, first.int2_k, first.int2_v, HeadSplit(1, second.int2_k, second.int2_v))
    return whole, (LayerKV(low.bf16_k[:, :1], low.bf16_v[:, :1], first.int2_k, first.int2_v), second), tables


def _check_split_decode(device: str, d: int, rep: int, seed: int) -> None:
    from oscarkv.kernels.decode import splits_in_one

    whole, (first, second), tables = _split_view(device, d, seed)
    assert splits_in_one(whole)
    q = torch.randn(2, 3 * rep, d, generator=torch.Generator(device=device).manual_seed(seed), device=device).bfloat16()
    q = q if device == "cuda" else q.float()
    out = decode_attention(q, whole, tables, d**-0.5)
    ref = torch.cat([decode_attention_ref(q[:, :rep].float(), first, tables, d**-0.5),
                     decode_attention_ref(q[:, rep:].float(), second, tables, d**-0.5)], dim=1)
    tol = max(2 * max(_bf16_torch_error(q[:, :rep], first, tables, d**-0.5, ref[:, :rep]),
                      _bf16_torch_error(q[:, rep:], second, tables, d**-0.5, ref[:, rep:])), 1e-3)
    assert _rel(out, ref) <= tol, (_rel(out, ref), tol)



def _check_split_extend(device: str, d: int, rep: int, seed: int) -> None:
    """Extend over a split view: staged chunks read it whole (each range's history gathered into its heads of one
    workspace), other routes by ranges; ≡ the oracle range by range, every route."""
    from oscarkv.attention.backends import TorchAttention
    from oscarkv.kernels.reference import extend_attention_ref

    whole, _, tables = _split_view(device, d, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    for chunks in ([3, 5], [MIN_CHUNK, 2], [MIN_CHUNK, MIN_CHUNK + 3]):
        t = sum(chunks)
        q, k, v = (torch.randn(t, n, d, generator=gen, device=device).bfloat16().float() for n in (3 * rep, 3, 3))
        cu = torch.tensor([0, chunks[0], t], dtype=torch.int32, device=device)
        out = TritonAttention().extend(q, k, v, whole, tables, cu, d**-0.5)
        ref = TorchAttention().extend(q, k, v, whole, tables, cu, d**-0.5)
        errs = [_bf16_error(q[:, lo * rep:hi * rep], k[:, lo:hi], v[:, lo:hi], view, tables, cu, d**-0.5,
                            extend_attention_ref(q[:, lo * rep:hi * rep], k[:, lo:hi], v[:, lo:hi], view, tables, cu,
                                                 d**-0.5)) for lo, hi, view in whole.ranges()]
        assert _rel(out, ref) <= max(2 * max(errs), 1e-3), (chunks, _rel(out, ref))


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
def test_split_layer_decodes_in_one_launch_cpu():
    _check_split_decode("cpu", 64, 2, seed=5)


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
def test_split_layer_extends_cpu():
    _check_split_extend("cpu", 64, 2, seed=6)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rep", [1, 4])
def test_split_layer_decodes_in_one_launch_gpu(rep):
    _check_split_decode("cuda", 128, rep, seed=rep)
    _check_split_extend("cuda", 128, rep, seed=rep)


def _split_layer(lens: list[int], d: int, lo: int, seed: int):
    """A layer of 3 KV heads a per-head allocation splits at ``lo``: heads ``[0, lo)`` with 2-bit keys, ``[lo, 3)``
    with 4-bit keys in pages of their own (``HeadSplit``), one BF16 pool, one page table."""
    from oscarkv.cache.paged_layout import HeadSplit

    two, tables = random_cache(lens, 3, d, sink=32, recent=64, seed=seed, bits=(2, 2))
    four, tables4 = random_cache(lens, 3, d, sink=32, recent=64, seed=seed, bits=(4, 2))
    assert all(torch.equal(getattr(tables, f), getattr(tables4, f)) for f in ("bf16_table", "int2_table"))

    def own(p: Int2Pages, a: int, b: int) -> Int2Pages:
        return replace(p, **{f: getattr(p, f)[:, a:b].contiguous() for f in ("codes", "scale", "zero")})
    split = HeadSplit(lo, own(four.int2_k, lo, 3), own(four.int2_v, lo, 3))
    return LayerKV(two.bf16_k, two.bf16_v, own(two.int2_k, 0, lo), own(two.int2_v, 0, lo), split), tables


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
def test_extend_graph_split_k_reads_a_split_layer_cpu():
    """An extend graph's split-K backend (``extend_graphs._FixedSplitK``, a fixed grid) on a layer of two head ranges
    ≡ the oracle range by range: the served default model's recipe splits layers so, and a short chunk after a prefix
    hit replays that graph (on the GPU it failed every such request, 2026-11-29)."""
    from oscarkv.attention.step import by_head_ranges
    from oscarkv.engine.extend_graphs import _FixedSplitK

    d, rep, t = 64, 2, 5
    kv, tables = _split_layer([300], d, 1, seed=7)
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(t, 3 * n, d, generator=gen).bfloat16().float() for n in (rep, 1, 1))
    cu = torch.tensor([0, t], dtype=torch.int32)
    out = _FixedSplitK(8).extend(q, k, v, kv, tables, cu, d**-0.5)
    ref = by_head_ranges(kv, lambda q_, k_, v_, kv_: extend_attention_ref(q_, k_, v_, kv_, tables, cu, d**-0.5), q, (k, v))
    tol = max(max(2 * _bf16_error(q[:, a * rep:b * rep], k[:, a:b], v[:, a:b], part, tables, cu, d**-0.5,
                                  ref[:, a * rep:b * rep]) for a, b, part in kv.ranges()), 1e-3)
    assert out.shape == ref.shape and _rel(out, ref) <= tol
