"""The attention backends behind :class:`~oscarkv.attention.step.AttentionBackend`.

:class:`TorchAttention` runs anywhere on the PyTorch oracles of ``oscarkv.kernels.reference``;
:class:`TritonAttention` is what :class:`~oscarkv.attention.step.StepContext` calls on a CUDA
device (:func:`default_backend` picks), the Triton kernels of ``oscarkv.kernels``:

* ``write``  — :func:`oscarkv.kernels.write.store_kv`: the step context has already mapped K/V
  into the stored domain (fp32, or bf16 views of the qkv projection for identity codecs), the
  kernel rounds to BF16 (nearest even, as ``Tensor.to``) and scatters K and V in one launch.
* ``demote`` — :func:`oscarkv.kernels.write.demote_pages` (bit-identical to
  ``TensorCodec.encode`` of the BF16 page); ``demote_all`` —
  :func:`oscarkv.kernels.write.demote_layers`, every layer in one launch per clip rank (under a per-layer
  bit allocation, whose layers live in one pool per bit width, ``demote`` layer by layer). Every kernel
  takes its bit widths per launch from the layer's pages (``Int2Pages.bits``), so an allocation needs
  nothing else of them.
* ``extend`` — a chunk of at least ``prefill.MIN_CHUNK`` tokens: :func:`oscarkv.kernels.prefill.prefill_attention`
  (its prefix staged in bf16 segments, cuDNN attention, a log-sum-exp merge with its causal self part);
  shorter chunks (the decode rows of a mixed step): :func:`oscarkv.kernels.extend.extend_attention`.
* ``extend_queries`` — an extend step's query map ``q @ R_K⁻ᵀ`` as one bf16 tensor-core product (the
  extend kernels round the mapped queries to bf16 for their products anyway).
* ``decode`` — :func:`oscarkv.kernels.decode.decode_attention` (pure decode steps);
  ``decode_inputs`` — :func:`oscarkv.kernels.fused.qk_map`: an OSCAR layer's query map and key
  rotation (and centering) in one launch instead of ~10 PyTorch kernels (0.9 ms of a 6.6 ms
  Qwen3-4B step at 100K on an H100, 2026-11-22, ``lab/record/benchmarks-log.md``); ``decode_qk`` —
  :func:`oscarkv.kernels.fused.qk_norm_rope_map`: the same maps fused with the model's QK-norm
  and RoPE, one launch per layer where ``qk_norm_rope_`` then ``qk_map`` take two (what the
  model's CUDA path uses, in decode steps and in extend steps of up to ``fused_extend_tokens``:
  speculative verify steps; ``decode_inputs`` stays for callers that hand over roped q and k).

``decode_steps = True``: the model runner sends a step whose chunks are all one token long to
``decode`` over the cache *including* the token just written (its K/V as stored, BF16),
instead of ``extend`` (its K/V at fp32 next to the stored prefix). The two differ only by the
BF16 rounding of the current token's own K/V; ``TorchAttention`` keeps ``extend`` so that the
CPU path stays bit-identical to ``OscarCache``.

NOTE: the kernel modules are imported on first use, not at import time: Triton decides between
compiled and interpreted kernels when a ``@triton.jit`` function is defined.
"""

from __future__ import annotations

import torch

from oscarkv.cache.kv_pools import KVPools
from oscarkv.cache.paged_layout import LayerKV, PageTables, device_tensor
from oscarkv.attention.step import AttentionBackend, LayerStorage, QKRope, by_head_ranges, stored_domain
from oscarkv.kernels import reference as ref
from oscarkv.quant.codec import TensorCodec


ONE_LAUNCH_PROGRAMS = 64
"""A layer a per-head allocation splits decodes in one launch below this many (sequence, KV head) programs before
splitting (``TritonAttention.decode``), by head ranges from it on."""


class TorchAttention(AttentionBackend):
    """The PyTorch implementation (CPU or GPU): ``oscarkv.kernels.reference`` behind the interface."""

    def write(self, kv: LayerKV, k_rot: torch.Tensor, v_rot: torch.Tensor, slots: torch.Tensor) -> None:
        # NOTE: for BF16 pools this is ``reference.write_ref`` after ``to_rotated`` (tested
        # equal); the cast goes to the pool's dtype so that kv=bf16 pools of an fp32 model
        # store K/V unrounded (see oscarkv.cache.kv_pools).
        s = slots.long()
        page, off = s // kv.page_size, s % kv.page_size
        kv.bf16_k[page, :, off] = k_rot.to(kv.bf16_k.dtype)
        kv.bf16_v[page, :, off] = v_rot.to(kv.bf16_v.dtype)

    def demote(self, kv: LayerKV, key: TensorCodec, value: TensorCodec, src: torch.Tensor, dst: torch.Tensor) -> None:
        ref.demote_ref(kv.bf16_k, src, kv.int2_k, dst, key)
        ref.demote_ref(kv.bf16_v, src, kv.int2_v, dst, value)

    def extend(self, q, k_new, v_new, kv, tables, cu_seqlens, scale, cu_host=None):
        if kv.split is not None:  # a per-head split: the oracles read one range at a time
            return by_head_ranges(kv, lambda q_, k_, v_, kv_: self.extend(q_, k_, v_, kv_, tables, cu_seqlens, scale),
                                  q, (k_new, v_new))
        return ref.extend_attention_ref(q, k_new, v_new, kv, tables, cu_seqlens, scale)

    def decode(self, q, kv, tables, scale, out_dtype=None):
        if kv.split is not None:
            return by_head_ranges(kv, lambda q_, kv_: self.decode(q_, kv_, tables, scale, out_dtype), q)
        out = ref.decode_attention_ref(q, kv, tables, scale)
        return out if out_dtype is None else out.to(out_dtype)


class TritonAttention(AttentionBackend):
    """Triton kernels for the write path, demotion, extend and decode (see the module docstring)."""

    decode_steps = True
    fused_extend_tokens = 512  # NOTE: verify steps, follow-ups and serve's 512-token prefill chunks. The unfused maps
    # are QK-norm + RoPE, an fp32 key GEMM, a query GEMM and five elementwise kernels a layer: ~0.9 ms of a verify step
    # at the Qwen3-4B shape; in 512-token chunks, host-bound launches (a cold 32K prompt as served 2.96-3.24 s against
    # 2.33-2.46 fused, H200, 2026-11-28, lab.scripts.fused_maps_check). Longer chunks keep the tensor-core GEMMs.

    def write(self, kv: LayerKV, k_rot: torch.Tensor, v_rot: torch.Tensor, slots: torch.Tensor) -> None:
        from oscarkv.kernels.write import store_kv

        store_kv(k_rot, v_rot, kv.bf16_k, kv.bf16_v, slots)

    def demote(self, kv: LayerKV, key: TensorCodec, value: TensorCodec, src: torch.Tensor, dst: torch.Tensor) -> None:
        from oscarkv.kernels.write import demote_pages

        demote_pages(kv.bf16_k, src, kv.int2_k, dst, key)
        demote_pages(kv.bf16_v, src, kv.int2_v, dst, value)

    def demote_all(self, pools: KVPools, storage: list[LayerStorage], src: torch.Tensor, dst: torch.Tensor) -> None:
        from oscarkv.kernels.write import demote_layers

        if pools.int2_k is None or pools.sliding:  # no one pool holds every layer: one launch per (global) layer
            return super().demote_all(pools, storage, src, dst)
        demote_layers(pools.bf16_k, src, pools.int2_k, dst, [st.key for st in storage])
        demote_layers(pools.bf16_v, src, pools.int2_v, dst, [st.value for st in storage])

    def decode_inputs(self, st: LayerStorage, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        maps = st.decode_maps
        if maps is None or not q.is_cuda:
            return super().decode_inputs(st, q, k, v)
        from oscarkv.kernels.fused import qk_map

        q_r, k_s = qk_map(q, k, *maps, st.key.mean)
        return q_r, k_s, stored_domain(st.value, v)

    def extend_queries(self, st: LayerStorage, q: torch.Tensor) -> torch.Tensor:
        # NOTE: bf16 q (the model's) times R_K⁻ᵀ in bf16 on the tensor cores, bf16 out: every extend kernel
        # rounds the mapped q to bf16 for its products anyway, and R's rounding adds an error of that order;
        # the fp32 einsum cost ~0.05 s of a 32K prefill on the 4B shape (H100, docs/BENCHMARKS.md)
        r = st.query_map_bf16
        if r is None or not q.is_cuda or q.dtype != torch.bfloat16:
            return super().extend_queries(st, q)
        t, hq, d = q.shape
        h = r.shape[0]  # NOTE: einsum("thrd,hde->thre") as one batched matmul (to_rotated's note)
        qh = q.view(t, h, hq // h, d).transpose(0, 1).reshape(h, t * hq // h, d)  # [H, t·rep, d]
        return torch.matmul(qh, r).view(h, t, hq // h, d).transpose(0, 1).reshape(t, hq, d)

    def decode_qk(self, st: LayerStorage, x: torch.Tensor, rope: QKRope):
        maps = st.decode_maps
        if maps is None or not x.is_cuda:
            return None
        from oscarkv.kernels.fused import qk_norm_rope_map

        return qk_norm_rope_map(x, rope.num_q, rope.q_weight, rope.k_weight, rope.cos, rope.sin, rope.eps,
                                (*maps, st.key.mean))

    def extend(self, q, k_new, v_new, kv, tables: PageTables, cu_seqlens, scale, cu_host=None):
        from oscarkv.kernels import chunk_splitk
        from oscarkv.kernels.extend import extend_attention
        from oscarkv.kernels.pools import rows_contiguous
        from oscarkv.kernels.prefill import prefill_attention

        cu = cu_host or tuple(cu_seqlens.tolist())
        spans = [(cu[b], cu[b + 1]) for b in range(len(cu) - 1)]
        lens = tables.lens()
        route = _routes(spans, lens, chunk_splitk.serves(kv))
        if kv.split is not None and set(route) - {"empty"} != {"staged"}:  # the staged path alone reads a split whole
            return by_head_ranges(kv, lambda q_, k_, v_, kv_: self.extend(q_, k_, v_, kv_, tables, cu_seqlens, scale,
                                                                          cu), q, (k_new, v_new))
        if len(set(route) - {"empty"}) == 1 and "staged" not in route:  # one kernel for the whole step
            kernel = chunk_splitk.chunk_attention if "splitk" in route else extend_attention
            return kernel(rows_contiguous(q), rows_contiguous(k_new), rows_contiguous(v_new), kv, tables, cu_seqlens,
                          scale, max_chunk=max(hi - lo for lo, hi in spans))
        if route == ["staged"]:  # one sequence, all of it staged (a long chunk alone: a prompt, a follow-up)
            return prefill_attention(q, k_new, v_new, kv, tables, 0, (lens[0][0], lens[1][0]), scale)
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        for b, how in enumerate(route):  # NOTE: one sequence at a time: the staged prefix workspace is per sequence
            if how == "staged":
                lo, hi = spans[b]
                out[lo:hi] = prefill_attention(q[lo:hi], k_new[lo:hi], v_new[lo:hi], kv, tables, b,
                                               (lens[0][b], lens[1][b]), scale)
        for how, kernel in (("splitk", chunk_splitk.chunk_attention), ("tile", extend_attention)):
            seqs = [b for b, r in enumerate(route) if r == how]
            if seqs:  # the other chunks (e.g. the decode rows of a mixed step): one kernel over their rows
                rows = device_tensor([r for b in seqs for r in range(*spans[b])], q.device, torch.long)
                sub = [0]
                for b in seqs:
                    sub.append(sub[-1] + spans[b][1] - spans[b][0])
                out[rows] = kernel(q[rows], k_new[rows], v_new[rows], kv, tables.select(seqs),
                                   device_tensor(sub, q.device), scale,
                                   max_chunk=max(spans[b][1] - spans[b][0] for b in seqs)).float()
        return out

    def decode(self, q, kv, tables: PageTables, scale, out_dtype=None):
        from oscarkv.kernels.decode import decode_attention

        # NOTE: strided q rows (a view of qkv) are fine; out_dtype spares an OSCAR step (fp32 mapped
        # queries) one cast kernel per layer: the merge kernel rounds to it (42 µs of a Qwen3-4B step
        # at 100K on an H100, 2026-11-23)
        if kv.split is not None and not _one_launch(kv, q.shape[0]):
            return by_head_ranges(kv, lambda q_, kv_: decode_attention(q_, kv_, tables, scale, out_dtype=out_dtype), q)
        return decode_attention(q, kv, tables, scale, out_dtype=out_dtype)


def default_backend(device: torch.device) -> AttentionBackend:
    """Triton kernels on CUDA, the PyTorch oracles anywhere else."""
    return TritonAttention() if torch.device(device).type == "cuda" else TorchAttention()


def _one_launch(kv: LayerKV, batch: int) -> bool:
    """Whether the decode kernel takes ``kv``'s per-head split in one launch (``ONE_LAUNCH_PROGRAMS``).

    NOTE: Qwen3-8B shape, 100K, 26 of 36 layers split, H200, 2026-11-27 (lab/results/gpu_heads/): batch 1 (8 KV-head
    programs) 6.51 ms a step in one launch against 7.18 by ranges; batch 8 (64) 13.69 against 13.07. The threshold
    between them is not measured."""
    from oscarkv.kernels.decode import splits_in_one

    return splits_in_one(kv) and batch * kv.bf16_k.shape[1] < ONE_LAUNCH_PROGRAMS


def _routes(spans: list[tuple[int, int]], lens: tuple[tuple[int, ...], tuple[int, ...]], splitk: bool) -> list[str]:
    """The path of each chunk of an extend step, by shape: ``"splitk"`` (:mod:`oscarkv.kernels.chunk_splitk`, where
    its table ``prefers_splitk`` says so and the layout ``serves``), ``"staged"`` (:mod:`oscarkv.kernels.prefill`,
    chunks of at least ``MIN_CHUNK`` tokens), ``"tile"`` (:mod:`oscarkv.kernels.extend`), ``"empty"``."""
    from oscarkv.kernels.chunk_splitk import prefers_splitk
    from oscarkv.kernels.prefill import MIN_CHUNK

    def route(b: int, c: int) -> str:
        if c == 0:
            return "empty"
        if splitk and prefers_splitk(c, lens[0][b] + lens[1][b], lens[1][b] > 0):
            return "splitk"
        return "staged" if c >= MIN_CHUNK else "tile"

    return [route(b, hi - lo) for b, (lo, hi) in enumerate(spans)]
