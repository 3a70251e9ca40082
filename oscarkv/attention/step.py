"""Attention over the paged mixed cache: the per-step context and the backend interface it calls.

Role: the seam between the model and the KV cache. A model layer hands its post-RoPE
``q [T, Hq, d]``, ``k, v [T, H, d]`` to :meth:`StepContext.attention`, which

1. maps K and V into the stored domain with the layer's codecs (``TensorCodec.to_rotated``:
   keys centered and rotated by ``R_K``; values only centered, their rotation being folded
   into the weights — ``oscarkv.models.folding``),
2. writes them into their BF16 slots (:meth:`AttentionBackend.write`; the pages a step demotes to INT2 the
   model runner encodes in every layer at once, :meth:`AttentionBackend.demote_all`: before the forward those
   the chunk reads, after it those the step wrote, before a graph's replay all of them),
3. rotates the queries once (``q @ R_K`` per KV-head group) and runs extend attention: each
   chunk sees its prefix as stored (the step's :class:`PageTables`) plus itself at full
   precision, causally — the rule of ``OscarCache`` (``oscarkv.cache.hf_cache``).

On a decode step the model first offers its un-normed, un-roped qkv projection
(:meth:`StepContext.attention_from_qkv` with a :class:`QKRope`, what the model would do to its q
and k heads): a backend that fuses QK-norm + RoPE with the stored-domain maps
(:meth:`AttentionBackend.decode_qk`, the Triton one for OSCAR keys) takes it from there;
otherwise the model applies them itself and calls :meth:`StepContext.attention`.

NOTE: with ``TorchAttention`` every step, decode included, goes through ``extend``: the
current token attends to itself at full precision, as in ``OscarCache``. A backend with
``decode_steps = True`` (the Triton one, ``oscarkv.attention.backends``) gets the steps in
which every sequence computes one token as ``decode`` instead (``StepContext.decode``): all
tokens read from the cache, the current one as just stored (BF16).

Sliding-window layers (Gemma 3, :class:`~oscarkv.quant.bpe.SlidingLayers`): ``pools.sliding``
names them; their K/V are stored as given (no codec: a BF16 window, never INT2) in the window
pool at the step's :class:`WindowStep` slots, and they attend over their window view with a band
(:meth:`AttentionBackend.extend_window`: the PyTorch band for every backend, the window being short;
the Triton kernels serve the global layers). In decode steps too, a sliding layer's token attends to
its window as stored and to itself at full precision (extend's rule: ``OscarCache``'s).

The implementations live in :mod:`oscarkv.attention.backends`: ``TorchAttention`` runs
anywhere, the CPU included, on the PyTorch oracles of ``oscarkv.kernels.reference`` (the
reference the Triton kernels are tested against); ``TritonAttention`` implements the same four
methods with the Triton kernels. The runner builds one
:class:`StepContext` per step and passes it down the model explicitly (no global state).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from functools import cached_property

import torch

from oscarkv.cache.kv_pools import KVPools
from oscarkv.cache.paged_layout import LayerKV, PageTables
from oscarkv.kernels import reference as ref
from oscarkv.quant.codec import TensorCodec


class AttentionBackend(ABC):
    """Write path and attention over :class:`LayerKV` pages (see the layout contract)."""

    decode_steps: bool = False
    """Whether one-token-per-sequence steps go to :meth:`decode` (else :meth:`extend`)."""

    fused_extend_tokens: int = 0
    """Extend steps of at most this many tokens (speculative verify steps, short follow-ups) take :meth:`decode_qk`'s
    fused input maps as decode steps do (:meth:`StepContext.attention_from_qkv`); 0: none."""

    @abstractmethod
    def write(self, kv: LayerKV, k_rot: torch.Tensor, v_rot: torch.Tensor, slots: torch.Tensor) -> None:
        """Store stored-domain ``k_rot, v_rot [T, H, d]`` (fp32, or the model's dtype in decode steps
        whose codecs are the identity; rows may be strided) at flat BF16 slots ``[T]``."""

    @abstractmethod
    def demote(self, kv: LayerKV, key: TensorCodec, value: TensorCodec, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Encode full BF16 pages ``src [n]`` into INT2 pages ``dst [n]`` (``TensorCodec.encode``)."""

    def demote_all(self, pools: KVPools, storage: list[LayerStorage], src: torch.Tensor, dst: torch.Tensor) -> None:
        """:meth:`demote` of the same pages in every global layer (CUDA graphs run it before the replay; eager
        steps before and after the forward, ``ModelRunner.forward``); sliding layers hold no INT2 pages."""
        for i, st in enumerate(storage):
            if i not in pools.sliding:
                for (_, kv), (_, key) in zip(pools.parts(i), st.key.head_parts()):  # a per-head split: each range
                    self.demote(kv, key, st.value, src, dst)

    def decode_inputs(self, st: LayerStorage, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A decode step's ``(q @ R_K⁻ᵀ, k, v in the stored domain)``; identity codecs keep the model's
        dtype and the views of the qkv projection (no fp32 copy: bf16 -> fp32 -> bf16 stores the same bytes)."""
        return st.rotate_queries(q, keep_dtype=True), stored_domain(st.key, k), stored_domain(st.value, v)

    def extend_queries(self, st: LayerStorage, q: torch.Tensor) -> torch.Tensor:
        """An extend step's ``q @ R_K⁻ᵀ`` (fp32; ``q`` itself without a key transform)."""
        return st.rotate_queries(q, keep_dtype=True)

    def decode_qk(self, st: LayerStorage, x: torch.Tensor, rope: QKRope) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A decode step's ``(q @ R_K⁻ᵀ, k in the stored domain)`` (as :meth:`decode_inputs`) straight from
        the un-roped q and k heads ``x [T, Hq + H, d]``, ``rope`` applied on the way; ``None`` (here): not
        fused, the model applies ``rope`` and :meth:`decode_inputs` maps its q and k."""
        return None

    @abstractmethod
    def extend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: LayerKV,
               tables: PageTables, cu_seqlens: torch.Tensor, scale: float,
               cu_host: tuple[int, ...] | None = None) -> torch.Tensor:
        """Rotated ``q [T, Hq, d]`` (fp32, or the model's dtype for identity codecs) over each sequence's cached
        prefix plus its chunk → ``[T, Hq, d]`` fp32 or q's dtype (``cu_host``: ``cu_seqlens`` on the host, if the
        caller has it)."""

    def extend_window(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: LayerKV,
                      window: WindowStep, cu_seqlens: torch.Tensor, scale: float) -> torch.Tensor:
        """:meth:`extend` of a sliding-window layer over its window view (``window.tables``, the K/V as given,
        no codec): query ``p`` reads keys ``(p - window.size, p]`` → fp32 ``[T, Hq, d]``.

        NOTE: the PyTorch oracle on any device, one sequence at a time: a window view holds at most
        ``W + P - 2`` tokens, so its gather is small next to the global layers' history, which the
        backend's own kernels read; a Triton band kernel is not written."""
        return ref.extend_attention_ref(q, k_new, v_new, kv, window.tables, cu_seqlens, scale, window.size)

    @abstractmethod
    def decode(self, q: torch.Tensor, kv: LayerKV, tables: PageTables, scale: float,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """One rotated query per sequence ``[B, Hq, d]`` (fp32 or bf16) over its whole cache →
        ``[B, Hq, d]`` (``out_dtype``, default fp32 or q's dtype: the decode step asks for the model's
        dtype, which the output is cast to anyway)."""


@dataclass(frozen=True)
class LayerStorage:
    """How one layer's K and V are stored: the key codec and the (folded) value codec."""

    key: TensorCodec
    value: TensorCodec

    def to(self, device: torch.device | str) -> LayerStorage:
        """The codec tensors on ``device`` (once, not per step: CUDA graphs cannot capture the copy)."""
        def move(c: TensorCodec) -> TensorCodec:
            return replace(c, **{f: getattr(c, f).to(device) for f in ("rotation", "mean", "inverse")
                                 if getattr(c, f) is not None})
        return LayerStorage(move(self.key), move(self.value))

    @cached_property
    def decode_maps(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(W_Q, W_K)`` ``[H, d, d]`` contiguous, output channel first — ``q @ R⁻ᵀ = W_Q q`` and
        ``k @ R = W_K k`` per head (``W_Q = R⁻¹``, ``W_K = Rᵀ``) — for ``oscarkv.kernels.fused.qk_map``;
        ``None`` without a key transform. Built on first use (before CUDA-graph capture: warm-up)."""
        back = self.key.back_map()
        return None if back is None else (back.contiguous(), self.key.rotation.transpose(-1, -2).contiguous())

    @cached_property
    def query_map_bf16(self) -> torch.Tensor | None:
        """``R_K⁻ᵀ [H, d, d]`` in bf16, contiguous (the tensor-core query map of long extend steps); ``None``
        without a key transform."""
        r = self.key.query_map()
        return None if r is None else r.to(torch.bfloat16).contiguous()

    def rotate_queries(self, q: torch.Tensor, keep_dtype: bool = False) -> torch.Tensor:
        """``q [T, Hq, d]`` → ``q @ R_K⁻ᵀ`` per KV-head group (``= q @ R_K`` for an orthogonal R_K), fp32
        (``keep_dtype``: ``q`` itself when there is no rotation)."""
        r = self.key.query_map()
        if r is None:
            return q if keep_dtype else q.float()
        T, Hq, d = q.shape
        qg = q.float().view(T, r.shape[0], Hq // r.shape[0], d)  # [T, H, rep, d]
        return torch.einsum("thrd,hde->thre", qg, r.to(q.device)).reshape(T, Hq, d)


@dataclass(frozen=True)
class QKRope:
    """What a model does to its q and k heads between the qkv projection and attention: the optional
    RMS QK-norm over ``d`` (``q_weight`` on the first ``num_q`` heads, ``k_weight`` on the others; both
    ``None`` without), then RoPE with ``cos, sin [T, d]`` (``oscarkv.kernels.fused.qk_norm_rope_``)."""

    num_q: int
    cos: torch.Tensor
    sin: torch.Tensor
    q_weight: torch.Tensor | None = None
    k_weight: torch.Tensor | None = None
    eps: float = 0.0


@dataclass(frozen=True)
class WindowStep:
    """A step's view of the sliding layers' window pool (``oscarkv.cache.window``): ``tables`` list each
    sequence's window pages of its prefix (BF16 only; consecutive positions, the chunk follows them);
    ``slots [T]`` the flat window-pool slots of the new tokens; ``size`` the window ``W``."""

    tables: PageTables
    slots: torch.Tensor
    size: int


@dataclass
class StepContext:
    """Everything attention needs for one step; built by the model runner, read by every layer.

    ``slots [T]`` flat BF16 slots of the new tokens;
    ``tables`` the prefix views; ``cu_seqlens int32 [B + 1]`` the chunk boundaries in the
    flat token batch. ``decode``: one token per sequence, and ``tables`` already include it
    (the runner's decode view), so attention is :meth:`AttentionBackend.decode`."""

    backend: AttentionBackend
    pools: KVPools
    storage: list[LayerStorage]
    tables: PageTables
    cu_seqlens: torch.Tensor
    slots: torch.Tensor
    scale: float
    decode: bool = False
    cu_host: tuple[int, ...] | None = None
    """``cu_seqlens`` on the host, when the builder has it (spares ``extend`` a device sync)."""
    window: WindowStep | None = None
    """The sliding layers' view (models with sliding-window layers only)."""

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write this step's K/V of ``layer``, attend (see the module docstring)."""
        st, kv = self.storage[layer], self.pools.layer(layer)
        if layer in self.pools.sliding:  # decode steps too: the window view excludes the token written now
            assert self.window is not None, "a sliding layer needs the step's window view"
            self.backend.write(kv, k, v, self.window.slots)
            return self.backend.extend_window(q, k, v, kv, self.window, self.cu_seqlens, self.scale)
        if self.decode:
            return self._decode(layer, *self.backend.decode_inputs(st, q, k, v), q.dtype)
        # [T, H, d] fp32; NOTE: identity codecs (kv=bf16) keep the model's tensors: the same values without
        # fp32 copies of q, k and v (one prefill step of 8K tokens: ~0.3 GB of traffic per layer)
        return self._extend(layer, self.backend.extend_queries(st, q), stored_domain(st.key, k),
                            stored_domain(st.value, v))

    def attention_from_qkv(self, layer: int, qkv: torch.Tensor, rope: QKRope) -> torch.Tensor | None:
        """:meth:`attention` of the un-normed, un-roped projection ``qkv [T, Hq + 2H, d]`` (q, k, v heads)
        when the backend maps its q and k heads with ``rope`` in one pass (:meth:`AttentionBackend.decode_qk`:
        decode steps, and extend steps of up to ``fused_extend_tokens`` tokens); ``None`` otherwise, nothing done:
        the caller applies ``rope`` and calls :meth:`attention`. NOTE: ``qkv`` is only read (its q and k rows are
        not needed once mapped)."""
        if not (self.decode or qkv.shape[0] <= self.backend.fused_extend_tokens):
            return None
        st, nqk = self.storage[layer], (qkv.shape[1] + rope.num_q) // 2  # Hq + H
        qk = self.backend.decode_qk(st, qkv[:, :nqk], rope)
        if qk is None:
            return None
        v_s = stored_domain(st.value, qkv[:, nqk:])
        return self._decode(layer, *qk, v_s, qkv.dtype) if self.decode else self._extend(layer, *qk, v_s)

    def _extend(self, layer: int, q_r: torch.Tensor, k_s: torch.Tensor, v_s: torch.Tensor) -> torch.Tensor:
        """Write the stored-domain ``k_s, v_s``, attend with the mapped queries ``q_r`` over the prefix and
        the chunk."""
        kv = self.pools.layer(layer)
        self.backend.write(kv, k_s, v_s, self.slots)
        return self.backend.extend(q_r, k_s, v_s, kv, self.tables, self.cu_seqlens, self.scale, self.cu_host)

    def _decode(self, layer: int, q_r: torch.Tensor, k_s: torch.Tensor, v_s: torch.Tensor,
                out_dtype: torch.dtype) -> torch.Tensor:
        """Write the stored-domain ``k_s, v_s``, attend with the mapped queries ``q_r``."""
        kv = self.pools.layer(layer)
        self.backend.write(kv, k_s, v_s, self.slots)
        return self.backend.decode(q_r, kv, self.tables, self.scale, out_dtype)


def by_head_ranges(kv: LayerKV, attend, q: torch.Tensor, heads: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """``attend(q, *heads, view)`` over each head range of a per-head split (:meth:`LayerKV.ranges`), the range's query
    heads (GQA groups are contiguous) and its KV heads of ``heads`` (``[T, H, d]`` each) as strided views; outputs
    joined along the query heads. How a backend that does not read a split layer whole serves it."""
    rep = q.shape[1] // kv.bf16_k.shape[1]
    return torch.cat([attend(q[:, lo * rep:hi * rep], *(x[:, lo:hi] for x in heads), view)
                      for lo, hi, view in kv.ranges()], dim=1)


def stored_domain(codec: TensorCodec, x: torch.Tensor) -> torch.Tensor:
    """``codec.to_rotated(x)``, or ``x`` unchanged (no fp32 copy) when the codec is the identity."""
    return x if codec.rotation is None and codec.mean is None else codec.to_rotated(x)
