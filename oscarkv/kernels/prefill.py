"""Prefill attention for long chunks: the cached prefix staged segment by segment, tensor-core attention.

A chunk of ``c`` new tokens attends to its whole cached prefix (``n`` tokens, BF16 windows and
INT2 history) and to itself causally. The work is ``4 · c · n · Hq · d`` flops for ``n · H · d``
cached values: compute bound once ``c`` is more than a few dozen tokens. So each cached value is
converted once per step and layer — amortized over *all* ``c × rep`` query rows of its KV head —
and the products run in a tuned attention kernel:

    for each segment of at most ``S`` cached tokens (BF16 tokens first, then INT2 ones):
        _gather_kernel:   pages → dense bf16 K, V [1, H, s, d]     (INT2: m + s·code, or m + s·L[code] with a
                          level table, in fp32, rounded to bf16 — the value the extend kernel feeds its dots)
        attention:        queries stacked per KV head, [1, H, rep·c, d] (no mask: every cached token is
                          visible to every chunk query, so the GQA group folds into the rows) → (o, lse)
    the chunk itself:     [1, Hq, c, d] over its own K/V [1, H, c, d], causal → (o, lse)
    lse_merge:            out = Σ_parts exp(lse_part − lse) · o_part,   lse = logsumexp over the parts
                          (one fp32 pass; the parts are read in their own layouts)

On CUDA the attention is cuDNN's fused kernel through ``aten._scaled_dot_product_cudnn_attention``
(it returns the log-sum-exp the merge needs; H100, 2026-11-23: 620 TFLOP/s stacked over a 96K prefix,
560 causal with native GQA, against 73 for the INT2 tile loop of :mod:`oscarkv.kernels.extend` and 350
for FlashAttention-2; ``docs/BENCHMARKS.md``); elsewhere a plain fp32 softmax (the CPU tests).

Memory: the workspace holds one segment, ``S = SEGMENT_BYTES / (4 · H · d)`` tokens (128K tokens at
``H · d = 1024``), never the whole dense prefix of every sequence; sequences run one after another.
Numerics: the same function as :func:`oscarkv.kernels.reference.extend_attention_ref` (cached values
as stored, the chunk at full precision rounded to bf16 for the products, as the extend kernel does).
"""

from __future__ import annotations

import contextlib
import torch
import triton
import triton.language as tl

from torch.profiler import record_function

from oscarkv.cache.paged_layout import LayerKV, PageTables
from oscarkv.kernels.decode import uses_raw_int2
from oscarkv.kernels.decode_int2 import _slices
from oscarkv.kernels.extend import _dequant
from oscarkv.kernels.lse_merge import headed, merge, stacked
from oscarkv.kernels.pools import format_args, history_arg, window_arg

SEGMENT_BYTES = 512 << 20
"""Workspace of the staged K and V of one segment (bf16)."""
BLOCK = 64
"""Cached BF16 tokens per gather program."""
BLOCK_INT2 = 32
"""Cached INT2 tokens per gather program (4 warps): 0.32 ms for 100K tokens of one layer's K and V on an H100
against 0.48 at 64 (``python -m lab.scripts.gather_sweep``, 2026-11-27,
``lab/results/gpu_prefill_host/gather_sweep_partial.txt``; 64 tokens on fewer warps spill, ~7 ms)."""
RAW_GATHER: dict | None = {"BLOCK": 32, "num_warps": 4}
"""Tokens a program and warps of the raw-code INT2 gather (``raw_gather``), ``None``: the ``_dequant`` gather. Bit-equal
to it on an H200 (``tests/kernels/test_prefill.py::test_raw_gather_equals_dequant``) and twice as fast: 100K tokens of
one layer's K and V in 0.131 ms (3.6 TB/s; 8 warps 0.127) against 0.25-0.28; the staged step over them 1.567 ms
against 1.724 at 512 new tokens, 0.540 against 0.689 at 64 (one H200, 2026-11-29, ``python -m
lab.scripts.gather_sweep``, ``lab/bench_gpu/2026-11-28/s20_call1_h200``). sm_90 under Triton 3.6: 32 registers, no
spills, against 96 and 136 bytes of stack."""
MIN_CHUNK = 33
"""Chunks of at least this many tokens take this path (``TritonAttention.extend``); shorter ones over long prefixes
the split-K chunk kernel (``chunk_splitk.SPLITK_SHAPES``: up to 32 tokens), over short ones the tile kernel of
:mod:`oscarkv.kernels.extend`, which reads the prefix once per ``64 / rep`` query tokens (33 BF16 tokens over 100K:
3.4 ms a layer there against 0.45 here; one H200, 2026-11-29, ``lab/bench_gpu/2026-11-28/s20_call6_h200``)."""


@triton.jit
def _raw_rows(kind, crow, srow, ok, dst, D: tl.constexpr, G: tl.constexpr, CONV: tl.constexpr):
    """Uniform 2-bit rows ``m + s·code`` of one kind into bf16 rows ``dst [N]`` (channel 0 of each), four code
    slices at a time: byte ``j`` of a group holds channels ``i·LG + j`` in bits ``2i..2i+1`` (``decode_int2``'s
    column order), so each slice (``decode_int2._slices``: ``code · 4^i · 2^-24``, exact) is a contiguous run of
    ``LG`` channels. Bit-equal to ``extend._dequant``: the slice unit goes into the scale, a power of two."""
    C, S, Z, _, _ = kind
    LG: tl.constexpr = G // 4
    j = tl.arange(0, LG)
    for g in tl.static_range(D // G):
        c0, c1, c2, c3 = _slices(tl.load(C + crow[:, None] + g * LG + j[None, :], mask=ok[:, None], other=0), CONV)
        s = tl.load(S + srow + g, mask=ok, other=0.0).to(tl.float32)[:, None]
        z = tl.load(Z + srow + g, mask=ok, other=0.0).to(tl.float32)[:, None]
        out = dst[:, None] + g * G + j[None, :]
        tl.store(out, (z + s * 2.0**24 * c0.to(tl.float32)).to(dst.dtype.element_ty), mask=ok[:, None])
        tl.store(out + LG, (z + s * 2.0**22 * c1.to(tl.float32)).to(dst.dtype.element_ty), mask=ok[:, None])
        tl.store(out + 2 * LG, (z + s * 2.0**20 * c2.to(tl.float32)).to(dst.dtype.element_ty), mask=ok[:, None])
        tl.store(out + 3 * LG, (z + s * 2.0**18 * c3.to(tl.float32)).to(dst.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _gather_tile(window, history, Table, out, span, D: tl.constexpr, G: tl.constexpr, P: tl.constexpr,
                 INT2: tl.constexpr, BLOCK: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr,
                 KLEV: tl.constexpr, VLEV: tl.constexpr, RAW: tl.constexpr = False, CONV: tl.constexpr = 0):
    """Tokens ``t0 + [i·BLOCK, (i+1)·BLOCK)`` of one tier of one sequence (``span = (t0, count, out0)``), KV head
    ``program_id(1)``, as rows ``out0 + ...`` of ``out = (OutK, OutV, head stride)``, ``[H, s, D]`` (bf16; fp32 in
    the CPU interpreter, which truncates fp32 → bf16 casts instead of rounding them). ``window`` (BF16 tier) or
    ``history`` (``INT2``): the bundles of :mod:`oscarkv.kernels.pools`; the other one is ``None``."""
    OutK, OutV, stride_oh = out
    t0, count, out0 = span
    h = tl.program_id(1)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < count
    toks = t0 + i
    page = tl.load(Table + toks // P, mask=ok, other=0).to(tl.int64)
    cols = tl.arange(0, D)
    dst = h * stride_oh + (out0 + i)[:, None].to(tl.int64) * D + cols[None, :]
    if INT2:
        keys, values, scale_strides = history
        sp, sh, st = scale_strides
        kp, kh, kt = keys[3]
        vp, vh, vt = values[3]
        # NOTE: pools.history_rows written out, in the order that compiles best (benchmarks.compile_sm90)
        crow = page * kp + h * kh + (toks % P) * kt
        vrow = page * vp + h * vh + (toks % P) * vt
        srow = page * sp + h * sh + (toks % P) * st
        if RAW:
            row = (out0 + i).to(tl.int64) * D + h * stride_oh
            _raw_rows(keys, crow, srow, ok, OutK + row, D, G, CONV)
            _raw_rows(values, vrow, srow, ok, OutV + row, D, G, CONV)
        else:
            tl.store(OutK + dst, _dequant(keys, crow, srow, ok, cols, G, KBITS, KLEV).to(OutK.dtype.element_ty),
                     mask=ok[:, None])
            tl.store(OutV + dst, _dequant(values, vrow, srow, ok, cols, G, VBITS, VLEV).to(OutV.dtype.element_ty),
                     mask=ok[:, None])
    else:
        Kb, Vb, strides = window
        bp, bh, bt = strides
        rows = (page * bp + h * bh + (toks % P) * bt)[:, None] + cols[None, :]
        tl.store(OutK + dst, tl.load(Kb + rows, mask=ok[:, None], other=0.0).to(OutK.dtype.element_ty),
                 mask=ok[:, None])
        tl.store(OutV + dst, tl.load(Vb + rows, mask=ok[:, None], other=0.0).to(OutV.dtype.element_ty),
                 mask=ok[:, None])


# NOTE: two kernels (one per tier) so that a profile tells the staging of BF16 pages from the dequantization
@triton.jit
def _gather_bf16_kernel(window, Table, out, span, D: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr):
    _gather_tile(window, None, Table, out, span, D, D, P, False, BLOCK, 2, 2, False, False)


@triton.jit
def _gather_int2_kernel(history, Table, out, span, D: tl.constexpr, G: tl.constexpr, P: tl.constexpr,
                        BLOCK: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr,
                        KLEV: tl.constexpr = False, VLEV: tl.constexpr = False, RAW: tl.constexpr = False,
                        CONV: tl.constexpr = 0):
    _gather_tile(None, history, Table, out, span, D, G, P, True, BLOCK, KBITS, VBITS, KLEV, VLEV, RAW, CONV)


def _gather(kv: LayerKV, table: torch.Tensor, int2: bool, t0: int, count: int,
            out_k: torch.Tensor, out_v: torch.Tensor, out0: int) -> None:
    """Tier tokens ``[t0, t0 + count)`` of the sequence whose page row is ``table`` → ``out_k/v[0, :, out0:]``."""
    if count <= 0:
        return
    _, h, p, d = kv.bf16_k.shape
    out, span = (out_k, out_v, out_k.stride(1)), (t0, count, out0)
    if not int2:
        _gather_bf16_kernel[(triton.cdiv(count, BLOCK), h)](window_arg(kv), table, out, span, D=d, P=p, BLOCK=BLOCK)
    else:  # each head range from its own history (one, or a per-head split's two) into its heads of the workspace
        for lo, hi, view in kv.ranges():
            rows = (out_k[:, lo:hi], out_v[:, lo:hi], out_k.stride(1))
            block, warps, raw = raw_gather(view, out_k.is_cuda)
            _gather_int2_kernel[(triton.cdiv(count, block), hi - lo)](history_arg(view), table, rows, span, D=d,
                                                                      G=kv.int2_k.group, P=p, BLOCK=block,
                                                                      num_warps=warps, **format_args(view), **raw)


def raw_gather(kv: LayerKV, cuda: bool) -> tuple[int, int, dict]:
    """``(tokens a program, warps, the raw path's flags)`` of the INT2 gather of ``kv``'s history: uniform 2-bit
    codes in the layouts the raw-code decode kernel reads go slice by slice (``_raw_rows``), the rest through
    ``extend._dequant``."""
    k2, v2 = kv.int2_k, kv.int2_v
    raw = k2.bits == v2.bits == 2 and k2.levels is None and v2.levels is None and uses_raw_int2(
        kv.bf16_k.shape[3], k2.group, kv.bf16_k.shape[2])
    if not raw or RAW_GATHER is None:
        return BLOCK_INT2, 4, {}
    return RAW_GATHER["BLOCK"], RAW_GATHER["num_warps"], {"RAW": True, "CONV": 2 if cuda else 0}


FLASH_ROWS = 512
"""Stacked query rows (``rep · c``) up to which the prefix runs FlashAttention-2 instead of cuDNN: few rows over
many keys, where FlashAttention splits the keys and cuDNN does not, and no graph to build (one H200, 2026-11-28,
``python -m lab.scripts.sdpa_shapes``: 256 rows over 100K keys 0.42 ms against cuDNN's 1.21, 2048 rows 2.96
against 1.26; ``lab/bench_gpu/2026-11-28/s15_call5_h200x2``)."""
CUDA_SHAPES: bool | None = None
"""The shape policy of CUDA (keys, rows and causal parts padded to few shapes; ``FLASH_ROWS`` rows through
FlashAttention-2's entry): ``None``, on CUDA tensors only; the tests force it on the CPU, where each call is the
fp32 softmax of its padded shapes."""
ROW_STEP = 256
"""cuDNN's stacked query rows are padded to a multiple of this (padding rows are computed and dropped)."""
CAUSAL_STEP = 64
"""The chunk's own causal part is padded to a multiple of this many tokens (causal: no real row sees a padding key)."""
WARM_LAST_CHUNKS = 512
""":func:`warm_cudnn` builds the causal shapes of last chunks up to this many tokens and the full chunk's: all 8 of a
512-token chunk, where an 8192-token chunk has 128 (~46 ms each on an H200: 6 s of start-up, 2026-11-28); a longer
last chunk builds its shape when first met."""
KEY_BUCKETS_PER_OCTAVE = 8
"""cuDNN builds a graph for every new shape (~40 ms on an H200, ``lab.scripts.sdpa_shapes``): a first cold 32K
prompt took 5.5 s and the next 1.7 s, every follow-up at a new length paid one or two builds. Its prefix keys are
padded to one of this many lengths per octave (at most 1/8 more keys) with zero keys and values, whose weight the
merge then sheds from the log-sum-exp (:mod:`oscarkv.kernels.lse_merge`)."""


KEY_SPANS: int | None = None
"""Spans the prefix call cuts its keys into (``None``: :func:`key_spans` on CUDA, one elsewhere; the tests force it).
One call runs one CTA per 128 stacked rows and KV head: 64 new tokens at GQA 4 over 100K keys fill 16 of an H200's
132 SMs. The spans are the call's batch (strided views of the workspace; the queries repeated), each with its own
``(o, lse)``, merged by :mod:`oscarkv.kernels.lse_merge` with the other parts (one H200, 2026-11-29, ``python -m
lab.scripts.ksplit_sdpa``, ``lab/bench_gpu/2026-11-28/s20_call5_h200``, 8 KV heads, ms: 256 rows over 100K keys
cuDNN 1.38 → 0.29 at 16 spans, FlashAttention 0.42-0.50 at any count; 1024 rows 1.35 → 0.83 at 4; 2048 rows 1.44
at 1 (the FLOPs 1.26); over 32K, 256 rows 0.42 → 0.12 at 8)."""
SPAN_MIN_KEYS = 4096
"""Keys a span holds at least."""


def key_spans(rows: int, n: int, heads: int, sms: int) -> int:
    """Spans of ``n`` keys for ``rows`` stacked rows of ``heads`` KV heads: the most (a power of two) that keep the
    call within two CTAs an SM and every span at least ``SPAN_MIN_KEYS`` keys; one when the rows alone fill half
    the SMs."""
    ctas, s = heads * -(-rows // 128), 1
    if 2 * ctas > sms:
        return 1
    while ctas * 2 * s <= 2 * sms and n // (2 * s) >= SPAN_MIN_KEYS:
        s *= 2
    return s


def _spans(q: torch.Tensor, n: int) -> int:
    """:func:`key_spans` of the stacked queries ``q [1, H, R, d]`` over ``n`` (bucketed) keys on this device."""
    if KEY_SPANS is not None:
        return KEY_SPANS
    if not q.is_cuda:
        return 1
    return key_spans(q.shape[2], n, q.shape[1], torch.cuda.get_device_properties(q.device).multi_processor_count)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _key_bucket(n: int) -> int:
    """``n`` keys rounded up to a multiple of 512 below 4096, else of ``2^(⌊log2 n⌋ − 3)``."""
    return _round_up(n, max(512, (1 << (n.bit_length() - 1)) // KEY_BUCKETS_PER_OCTAVE))


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x [1, H, S, d]`` with zero rows after its ``S`` up to ``rows``."""
    if x.shape[2] == rows:
        return x
    y = x.new_zeros(*x.shape[:2], rows, x.shape[3])
    y[:, :, :x.shape[2]] = x
    return y


def _cuda_shapes(q: torch.Tensor) -> bool:
    return CUDA_SHAPES if CUDA_SHAPES is not None else q.is_cuda


def _prefix_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                spans: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked queries ``q [1, H, R, d]`` over ``k/v [1, H, n, d]`` → ``(o, lse)``, ``R`` rows (zero keys padding
    ``k`` count in ``lse``: the merge sheds them); ``spans > 1``: the keys cut into that many equal spans
    (``KEY_SPANS``), ``o [spans, H, R, d]``, ``lse [spans, H, R]``, one per span. On CUDA: up to ``FLASH_ROWS`` rows
    in one span FlashAttention-2, else cuDNN over rows padded to ``ROW_STEP``."""
    rows, cuda = q.shape[2], _cuda_shapes(q)
    if spans == 1 and cuda and rows <= FLASH_ROWS and q.is_cuda:
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)[:2]
        return o, lse.reshape(q.shape[:3])
    if spans == 1 and (not cuda or rows <= FLASH_ROWS):  # NOTE: on the CPU, FlashAttention's rows as the fp32 softmax
        return _attend_lse(q, k, v, False, scale)
    _, h, n, d = k.shape
    assert n % spans == 0, f"{n} keys in {spans} spans"
    k, v = (x.view(h, spans, n // spans, d).transpose(0, 1) for x in (k, v))  # NOTE: views: span s at batch s
    q = _padded(q, _cudnn_rows(rows) if cuda else rows)
    o, lse = _attend_lse(q.expand(spans, -1, -1, -1).contiguous(), k, v, False, scale)
    return o[:, :, :rows], lse[:, :, :rows]


def _cudnn_rows(rows: int) -> int:
    """Stacked query rows as cuDNN runs them: up to a multiple of ``ROW_STEP``."""
    return _round_up(rows, ROW_STEP)


def cold_prompt_shapes(rep: int, chunk: int, max_tokens: int, seg: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The cuDNN shapes a cold prompt in ``chunk``-token chunks of up to ``max_tokens`` meets on CUDA: (stacked rows,
    keys) of each full chunk's prefix parts (none if its ``rep · chunk`` rows run FlashAttention-2; ``seg``: tokens
    a segment) and the lengths its causal parts are padded to (``CAUSAL_STEP`` multiples up to ``WARM_LAST_CHUNKS``
    and the full chunk's). Not here: a last chunk's prefix (other rows), longer last chunks, follow-ups (built when
    first met)."""
    prefix = set()
    if rep * chunk > FLASH_ROWS:
        for start in range(chunk, max_tokens, chunk):
            prefix.update((_cudnn_rows(rep * chunk), _key_bucket(min(seg, start - s0))) for s0 in range(0, start, seg))
    last = range(CAUSAL_STEP, _round_up(min(chunk, WARM_LAST_CHUNKS), CAUSAL_STEP) + 1, CAUSAL_STEP)
    return sorted(prefix), sorted({*last, _round_up(chunk, CAUSAL_STEP)})


def warm_cudnn(shape: tuple[int, int, int, int], chunk: int, max_tokens: int, scale: float,
               device: torch.device) -> int:
    """Build cuDNN's graphs for :func:`cold_prompt_shapes` now, at start-up, over zeros (nothing kept): a first
    long prompt otherwise pays ~40 ms a new shape (one H200, 2026-11-28: a process's first cold 32K prompt 3.0 s,
    the next 1.4). ``shape``: query heads, KV heads, head dim, page size. The number of shapes."""
    hq, h, d, page = shape
    prefix, causal = cold_prompt_shapes(hq // h, chunk, max_tokens, _segment_tokens(h, d, page))
    kv = torch.zeros(2, h * max(causal + [n for _, n in prefix]) * d, dtype=torch.bfloat16, device=device)
    for rows, n in prefix:  # NOTE: contiguous views of a flat buffer: the strides of the staged workspace
        _attend_lse(torch.zeros(1, h, rows, d, dtype=kv.dtype, device=device),
                    *(x[:h * n * d].view(1, h, n, d) for x in kv), False, scale)
    for c in causal:
        _attend_lse(torch.zeros(1, hq, c, d, dtype=kv.dtype, device=device),
                    *(x[:h * c * d].view(1, h, c, d) for x in kv), True, scale)
    return len(prefix) + len(causal)


def _causal_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk over itself, causal: on CUDA padded after its last token to ``CAUSAL_STEP`` (a few shapes)."""
    c = q.shape[2]
    if _cuda_shapes(q) and c % CAUSAL_STEP:
        n = _round_up(c, CAUSAL_STEP)
        o, lse = _attend_lse(_padded(q, n), _padded(k, n), _padded(v, n), True, scale)
        return o[:, :, :c], lse[:, :, :c]
    return _attend_lse(q, k, v, True, scale)


def _attend_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [1, Hx, S, d]`` over ``k/v [1, Hk, n, d]`` (``Hk`` divides ``Hx``) → ``(o [1, Hx, S, d], lse fp32 [1, Hx, S])``,
    natural-log ``lse``; ``causal``: square, row ``i`` sees keys ``≤ i``."""
    if q.is_cuda:
        o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False,
                                                                    scale=scale)[:2]
        return o, lse.reshape(q.shape[:3])
    rep = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    s = q.float() @ k.transpose(-1, -2) * scale  # [1, Hx, S, n]
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (s - lse[..., None]).exp() @ v, lse


def _bf16_layout(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``x.permute(dims)`` contiguous in bf16: one copy kernel that casts and lays out at once (an OSCAR step's
    mapped q and k are fp32: a cast, then a layout copy, was two launches a layer each)."""
    y = x.permute(dims)
    if y.dtype == torch.bfloat16:
        return y.contiguous()
    return torch.empty(y.shape, dtype=torch.bfloat16, device=y.device).copy_(y)


def _segment_tokens(h: int, d: int, p: int) -> int:
    return max(p, SEGMENT_BYTES // (4 * h * d) // p * p)


def _prefix(qs: torch.Tensor, c: int, kv: LayerKV, tables: PageTables, b: int, lens: tuple[int, int], scale: float,
            seg: int) -> list:
    """Parts of the chunk's ``c`` tokens, queries stacked per KV head (``qs [1, H, rep·c, d]``), over sequence
    ``b``'s cached tokens, ``seg`` at a time: BF16 tokens first, then INT2 ones, staged into one workspace per
    segment."""
    _, h, rows, d = qs.shape
    rep, (nb, ni), parts = rows // c, lens, []
    dtype = torch.bfloat16 if qs.is_cuda else torch.float32
    for s0 in range(0, nb + ni, seg):
        s1 = min(nb + ni, s0 + seg)
        spans = _spans(qs, _key_bucket(s1 - s0)) if _cuda_shapes(qs) else 1
        pad_keys = _cuda_shapes(qs) and (rows > FLASH_ROWS or spans > 1)  # cuDNN: few shapes (spans divide them)
        n = _key_bucket(s1 - s0) if pad_keys else s1 - s0
        k = torch.empty(1, h, n, d, dtype=dtype, device=qs.device)
        v = torch.empty_like(k)
        if n > s1 - s0:
            k[:, :, s1 - s0:] = 0
            v[:, :, s1 - s0:] = 0
        _gather(kv, tables.bf16_table[b], False, s0, min(s1, nb) - s0, k, v, 0)
        _gather(kv, tables.int2_table[b], True, max(s0, nb) - nb, s1 - max(s0, nb), k, v, max(0, nb - s0))
        parts.append(stacked(*_prefix_lse(qs, k, v, scale, spans), rep, c, n - (s1 - s0)))  # [S, H, rep·c, d], [S, H, rep·c]
    return parts


def prefill_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: LayerKV, tables: PageTables,
                      b: int, lens: tuple[int, int], scale: float, segment: int | None = None) -> torch.Tensor:
    """Chunk ``q [c, Hq, d]`` (rotated; fp32 or bf16) of sequence ``b`` over its cached prefix (``lens`` =
    BF16 and INT2 tokens, as in ``tables``) and its own ``k_new/v_new [c, H, d]`` (causal) → fp32
    ``[c, Hq, d]``; the oracle is ``reference.extend_attention_ref`` (see the module docstring). ``segment``:
    cached tokens staged at a time (a multiple of the page size; default from ``SEGMENT_BYTES``)."""
    c, hq, d = q.shape
    _, h, p, _ = kv.bf16_k.shape
    assert hq % h == 0 and k_new.shape == v_new.shape == (c, h, d), f"bad shapes q {tuple(q.shape)} k {tuple(k_new.shape)}"
    assert lens[1] == 0 or kv.int2_k is not None, "INT2 tokens listed for a BF16-only cache"
    parts, qc = [], _bf16_layout(q, (1, 0, 2))[None]  # [1, Hq, c, d]: query heads h·rep + r, so also [1, H, rep·c, d]
    if sum(lens):
        with _range("prefill.prefix"):
            parts += _prefix(qc.view(1, h, hq // h * c, d), c, kv, tables, b, lens, scale, segment or _segment_tokens(h, d, p))
    with _range("prefill.chunk"):
        kc, vc = (_bf16_layout(x, (1, 0, 2))[None] for x in (k_new, v_new))  # [1, H, c, d]
        parts.append(headed(*_causal_lse(qc, kc, vc, scale), hq // h))
    with _range("prefill.merge"):
        return merge(parts, c, hq, hq // h)


def _range(name: str):
    """A profiler range (``oscarkv bench prefill`` splits the time by part), nothing when no profiler runs: each
    range cost ~5-15 µs of host a call even then (three a layer; an H200's 8K-token prompt, 2026-11-28)."""
    return record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()
