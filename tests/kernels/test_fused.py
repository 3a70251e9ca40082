"""Fused elementwise kernels vs their oracles, the PyTorch expressions of ``oscarkv.models.llama``
(run on CPU tensors): bf16 inputs, awkward sizes (non-power-of-two hidden sizes, odd token
counts, head_dim 64/128, with and without QK-norm). The residual sum is bit-identical on CUDA; the
normalized outputs differ by the fp32 summation order only (at most one bf16 rounding step);
RoPE outputs are within one bf16 step.
NOTE: Triton's CPU interpreter rounds fp32 → bf16 differently from the GPU (not nearest-even),
so the bit-identity checks run on CUDA only; the interpreter is held to one bf16 step."""

import pytest
import torch
import torch.nn.functional as F

from oscarkv.attention.step import LayerStorage
from oscarkv.kernels.fused import TILE_FROM, qk_map, qk_norm_rope_, qk_norm_rope_map, rms_norm, silu_mul
from oscarkv.models.llama import RMSNorm, rotate_half

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _close(out: torch.Tensor, ref: torch.Tensor, identical: float = 0.99) -> None:
    """GPU: within one bf16 step of the oracle (absolute part: a flipped rounding of an operand
    before a cancelling sum), and bit-identical for a share ``identical`` of the elements.
    Interpreter: four steps."""
    out, tol = out.cpu().float(), (2 ** -7 if CUDA else 2 ** -5)
    ref = ref.float()
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol * ref.abs().max().item())
    if CUDA:
        assert (out == ref).float().mean().item() >= identical


def _norm(d, eps, seed):
    m = RMSNorm(d, eps)
    with torch.no_grad():
        m.weight.copy_(1 + 0.1 * torch.randn(d, generator=torch.Generator().manual_seed(seed)))
    return m.bfloat16()


@pytest.mark.parametrize("t,d,residual", [(1, 2560, True), (5, 96, False), (3, 4096, True), (2, 1000, False)])
def test_rms_norm(t, d, residual):
    x, y = torch.randn(t, d).bfloat16() * 3, torch.randn(t, d).bfloat16()
    m = _norm(d, 1e-6, seed=t + d)
    s = x + y if residual else x
    out, res = rms_norm(x.to(DEV), m.weight.to(DEV), m.eps, y.to(DEV) if residual else None)
    if CUDA:
        assert torch.equal(res.cpu(), s)
    _close(res, s)
    _close(out, m(s))
    assert out.dtype == torch.bfloat16


def _rope(x, cos, sin):
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


@pytest.mark.parametrize("t,hq,h,d,norm", [(1, 32, 8, 128, True), (3, 8, 8, 128, False), (7, 6, 2, 64, True)])
def test_qk_norm_rope(t, hq, h, d, norm):
    """In place on the q and k heads of a fused qkv row (v heads after them stay untouched)."""
    qkv = torch.randn(t, hq + 2 * h, d).bfloat16() * 2
    ang = torch.rand(t, d // 2) * 100
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
    mq, mk = (_norm(d, 1e-6, seed=t + i) if norm else None for i in range(2))
    q, k = qkv[:, :hq], qkv[:, hq:hq + h]
    ref_q = _rope(mq(q) if norm else q, cos, sin)
    ref_k = _rope(mk(k) if norm else k, cos, sin)
    x = qkv.to(DEV)
    out = qk_norm_rope_(x[:, :hq + h], hq, mq.weight.to(DEV) if norm else None, mk.weight.to(DEV) if norm else None,
                        cos.to(DEV), sin.to(DEV), mq.eps if norm else 0.0)
    assert out.data_ptr() == x.data_ptr()
    assert torch.equal(x[:, hq + h:].cpu(), qkv[:, hq + h:]), "touched the v heads"
    # NOTE: on an H100 (2026-11-22) 23% of the RoPE outputs differed from the CPU oracle by one
    # bf16 step even without QK-norm (cause not established); bound the share at 40%.
    _close(x[:, :hq], ref_q, identical=0.6)
    _close(x[:, hq:hq + h], ref_k, identical=0.6)


@pytest.mark.parametrize("t,inter", [(1, 9728), (3, 1000), (2, 4096)])
def test_silu_mul(t, inter):
    gu = torch.cat([torch.randn(t, inter) * 4, torch.randn(t, inter)], 1).bfloat16()
    out = silu_mul(gu.to(DEV))
    assert out.shape == (t, inter)
    _close(out, F.silu(gu[:, :inter]) * gu[:, inter:])


def _oscar_storage(h: int, d: int, centered: bool, seed: int) -> LayerStorage:
    """A layer whose key codec is a scaled (non-orthogonal) OSCAR transform, optionally centred, on ``DEV``."""
    from oscarkv.quant.artifact import scaled_transform
    from oscarkv.quant.codec import TensorCodec
    from oscarkv.quant.rotation import compose

    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(h, d, d, generator=g, dtype=torch.float64))[0]
    fwd, inv = scaled_transform(u, torch.rand(h, d, generator=g) + 0.5, compose(u, "uhp"))
    mean = torch.randn(h, d, generator=g) if centered else None
    return LayerStorage(TensorCodec(2, d, fwd, mean, 0.9, inverse=inv), TensorCodec(2, d)).to(DEV)


@pytest.mark.parametrize("t,hq,h,d,centered", [(1, 32, 8, 128, True), (3, 9, 3, 64, False), (2, 4, 4, 32, True)])
def test_qk_map_matches_the_codec_maps(t, hq, h, d, centered):
    """One launch = ``LayerStorage.rotate_queries`` (q @ R⁻ᵀ) and ``TensorCodec.to_rotated`` (centre,
    then R) of a scaled OSCAR key codec, with the maps ``LayerStorage.decode_maps`` builds; q and k are
    strided views of a qkv projection in bf16, as the engine hands them over."""
    st = _oscar_storage(h, d, centered, seed=t + d)
    qkv = (torch.randn(t, hq + 2 * h, d, generator=torch.Generator().manual_seed(t)) * 2).bfloat16().to(DEV)
    q, k = qkv[:, :hq], qkv[:, hq:hq + h]
    q_r, k_r = qk_map(q, k, *st.decode_maps, st.key.mean)
    assert q_r.dtype == k_r.dtype == torch.float32
    torch.testing.assert_close(q_r, st.rotate_queries(q), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k_r, st.key.to_rotated(k), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("t,h,rep,d", [(1, 8, 4, 128), (3, 4, 1, 64), (2, 2, 4, 64), (5, 3, 1, 128), (70, 2, 2, 64)])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("centered", [True, False])
def test_qk_norm_rope_map_matches_two_launches(t, h, rep, d, norm, centered):
    """One launch = ``qk_norm_rope_`` then ``qk_map`` (same device: identical up to the map's fp32
    summation order) and ≈ the PyTorch composition (RMSNorm, RoPE, ``rotate_queries``, ``to_rotated``:
    within the bf16 roundings of the roped q and k); the qkv rows are only read.
    NOTE: on CUDA the two kernels may sum a row's squares in different orders (other layouts); the
    last-bit change of the norm can flip a bf16 rounding of one element, which the map spreads over
    the row: with QK-norm, a few rows (≤ 5%, at least one allowed) are only held to one bf16 step of the
    output (H100: 1 of 15 rows in two of the 16 cases, 2026-11-23)."""
    hq, seed = h * rep, t * 1000 + h * 10 + rep + d
    g = torch.Generator().manual_seed(seed)
    st = _oscar_storage(h, d, centered, seed)
    qkv = (torch.randn(t, hq + 2 * h, d, generator=g) * 2).bfloat16()
    ang = torch.rand(t, d // 2, generator=g) * 100
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
    mq, mk = (_norm(d, 1e-6, seed=seed + i) if norm else None for i in range(2))
    args = (hq, mq.weight.to(DEV) if norm else None, mk.weight.to(DEV) if norm else None, cos.to(DEV), sin.to(DEV),
            mq.eps if norm else 0.0)
    x = qkv.to(DEV, copy=True)  # NOTE: qk_norm_rope_ below works in place
    q_r, k_s = qk_norm_rope_map(x[:, :hq + h], *args, (*st.decode_maps, st.key.mean))
    assert torch.equal(x.cpu(), qkv), "wrote to the qkv projection"
    assert q_r.shape == (t, hq, d) and k_s.shape == (t, h, d) and q_r.dtype == k_s.dtype == torch.float32
    roped = qk_norm_rope_(x[:, :hq + h], *args)
    two_q, two_k = qk_map(roped[:, :hq], roped[:, hq:], *st.decode_maps, st.key.mean)
    for out, two in ((q_r, two_q), (k_s, two_k)):
        scale = two.abs().max().item()
        torch.testing.assert_close(out, two, rtol=0, atol=2 ** -8 * scale)
        off_rows = int(((out - two).abs().amax(-1) > 1e-5 * scale).sum())
        assert off_rows <= (max(1, out.shape[0] * out.shape[1] // 20) if norm and CUDA else 0), off_rows
    q, k = qkv[:, :hq], qkv[:, hq:hq + h]
    ref_q = _rope(mq(q) if norm else q, cos, sin)  # CPU oracle (the maps follow their input's device)
    ref_k = _rope(mk(k) if norm else k, cos, sin)
    _close(q_r, st.rotate_queries(ref_q), identical=0)
    _close(k_s, st.key.to_rotated(ref_k), identical=0)


def test_qk_norm_rope_map_gives_each_token_its_own_values():
    """A token's mapped q and k do not depend on the other tokens of its step (bit for bit): below
    ``fused.TILE_FROM`` tokens each is computed alone (a verify step's tokens are a decode step's), from it in tiles of
    a fixed size (a 100-token chunk's tokens are those of the smallest tiled step holding them, at another place in
    its tile; the last, partial tile included)."""
    h, rep, d, t = 2, 2, 64, 100
    st = _oscar_storage(h, d, True, 5)
    g = torch.Generator().manual_seed(5)
    qkv = (torch.randn(t, h * rep + 2 * h, d, generator=g) * 2).bfloat16().to(DEV)
    emb = torch.cat([torch.rand(t, d // 2, generator=g) * 100] * 2, -1)
    cos, sin = emb.cos().bfloat16().to(DEV), emb.sin().bfloat16().to(DEV)
    w = _norm(d, 1e-6, 6).weight.to(DEV)
    maps = (*st.decode_maps, st.key.mean)
    call = lambda a, b: qk_norm_rope_map(qkv[a:b, :h * rep + h], h * rep, w, w, cos[a:b], sin[a:b], 1e-6, maps)  # noqa: E731
    whole, few = call(0, t), call(0, TILE_FROM - 1)
    for i in (0, 2, 3, 98, 99):
        a = min(i, t - TILE_FROM)
        tiled = call(a, a + TILE_FROM)
        for x, y in zip(whole, tiled):  # NOTE: the interpreter's dot (numpy) may round a row by its place in the tile
            torch.testing.assert_close(x[i], y[i - a], rtol=0 if CUDA else 1e-6, atol=0 if CUDA else 1e-6)
    for i in (0, 7, TILE_FROM - 2):
        alone = call(i, i + 1)
        assert torch.equal(few[0][i:i + 1], alone[0]) and torch.equal(few[1][i:i + 1], alone[1])
