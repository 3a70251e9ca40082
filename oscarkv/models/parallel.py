"""Tensor parallelism, Megatron style, for :class:`~oscarkv.models.llama.PagedLM`: which rows each rank holds.

Role: cut a model's weights and its per-head KV codecs into the shard of one rank, and sum the
partial outputs of the row-parallel projections across ranks. The processes, their groups and
the per-step hand-off live in ``oscarkv.engine.workers``; this module only needs the rank, the
number of ranks and the process group that carries the all-reduces (:class:`TensorParallel`).

Rank ``r`` of ``n``, in each decoder layer (``Hq`` query heads, ``H`` KV heads, ``I`` MLP width):

* ``qkv_proj`` (column parallel): the rows of query heads ``[r Hq/n, (r+1) Hq/n)`` and of its
  KV heads, ``[r H/n, (r+1) H/n)`` when ``n <= H``, else the one head ``r H // n`` (replicated on
  ``n / H`` ranks; ``max(1, H // n)`` per rank). Query head ``g`` reads KV head
  ``g // (Hq / H)``, so the query heads of a rank read exactly its KV heads.
* ``o_proj`` (row parallel): the columns of its query heads; one all-reduce sums the partial
  outputs. The bias is a partial sum too: rank 0 holds the checkpoint's, every rank adds its
  share of the folded value mean (``oscarkv.models.folding`` sums over the rank's query heads).
* ``gate_up_proj`` (column parallel): rows ``[r I/n, (r+1) I/n)`` of gate and of up;
  ``down_proj`` (row parallel) the matching columns, one all-reduce, its bias on rank 0.
* embeddings, norms and ``lm_head``: replicated (only rank 0 samples). In a decode graph each rank forms the
  logits of its ``V/n`` vocabulary rows and rank 0 gathers them (:func:`graph_logits`): at 100K, batch 1,
  rank 0 alone reading the whole head took 0.28 ms of a 3.7 ms Qwen3-8B step at tp 4 while the other ranks
  waited in the next all-reduce (four H200s, 2026-11-27, ``lab/bench_gpu/2026-11-27/tp_full_h200x4/``).

A rank's codecs are those of its KV heads (:func:`shard_codecs`: rows of every ``[H, ...]``
tensor of a rotation artifact), so the value rotations fold into its own rows of ``qkv_proj``
and ``o_proj`` and its pools store only its heads.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from oscarkv.models.blocks import RMSNorm
from oscarkv.models.llama import Backbone, PagedLM
from oscarkv.models.prefetch import issue
from oscarkv.quant.codec import LayerCodec, TensorCodec, with_bits

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
"""``all_gather_single`` where torch has it (2.13 deprecates ``all_gather_into_tensor``, its old name)."""


@dataclass(frozen=True)
class TensorParallel:
    """Rank ``rank`` of ``size``; ``group``: the torch.distributed process group of the device
    collectives (NCCL on CUDA, gloo on the CPU), ``None`` when ``size == 1``; ``reduce``: the all-reduce of
    the row-parallel projections (``oscarkv.models.allreduce``; ``None``: the group's backend)."""

    rank: int = 0
    size: int = 1
    group: Any = None
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None

    def q_heads(self, num_heads: int) -> slice:
        """This rank's query heads."""
        n = num_heads // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def kv_heads(self, num_kv_heads: int) -> slice:
        """This rank's KV heads: its share, or the one head it replicates when ranks outnumber them."""
        if self.size <= num_kv_heads:
            n = num_kv_heads // self.size
            return slice(self.rank * n, (self.rank + 1) * n)
        h = self.rank * num_kv_heads // self.size
        return slice(h, h + 1)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks (``x`` itself with one rank; in place, or a new tensor for a
        symmetric-memory ``reduce``)."""
        if self.size == 1:
            return x
        if self.reduce is not None:
            return self.reduce(x)
        dist.all_reduce(x, group=self.group)
        return x

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether a row-parallel projection's output ``x`` is left as this rank's partial sum, for the next
        norm to sum over the ranks (all-reduce ``one_shot_norm``, a message its buffer holds). NOTE: a function
        of ``x``'s shape and layout alone, so every rank and both ends (projection, norm) decide alike."""
        peers = getattr(self.reduce, "peers", None)
        return (peers is not None and x.dim() == 2 and x.dtype == torch.bfloat16 and x.stride(1) == 1
                and x.shape[0] <= len(peers.parity) and x.numel() <= peers.slot_elems)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of rank 0 on every rank, in place."""
        if self.size > 1:
            dist.broadcast(x, src=dist.get_global_rank(self.group, 0), group=self.group)
        return x


def check_shardable(config, size: int) -> None:
    """Raise ``ValueError`` naming the numbers unless ``config`` splits over ``size`` ranks."""
    hq, h, i = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if size > 1 and getattr(config, "num_experts", 0):
        raise ValueError(f"tensor_parallel_size={size}: the experts of a mixture-of-experts model are not sharded; use 1")
    if size < 1 or hq % size or i % size or (h % size and size % h):
        raise ValueError(f"tensor_parallel_size={size} does not split the model: it must divide the "
                         f"{hq} query heads and the MLP width {i}, and divide or be a multiple of the {h} KV heads")


def shard_config(config, tp: TensorParallel):
    """A copy of ``config`` with one rank's head counts and MLP width (``head_dim`` explicit)."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    out = copy.deepcopy(config)
    out.head_dim = d
    out.num_attention_heads = config.num_attention_heads // tp.size
    kv = tp.kv_heads(config.num_key_value_heads)
    out.num_key_value_heads = kv.stop - kv.start
    out.intermediate_size = config.intermediate_size // tp.size
    return out


def rank_tensors(state: dict[str, torch.Tensor], config, tp: TensorParallel) -> Iterator[tuple[str, torch.Tensor]]:
    """One rank's shard of a (fused, unfolded) :class:`PagedLM` state dict, tensor by tensor in the order of
    the sorted keys, contiguous, on the device of ``state`` (so that a shard is never whole in memory twice)."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    hq, h, i = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    q, kv = _rows(tp.q_heads(hq), d), _rows(tp.kv_heads(h), d)
    qkv = [q, _shift(kv, hq * d), _shift(kv, (hq + h) * d)]
    mlp = tp.q_heads(i)  # MLP channels split like heads of width 1
    gate_up = [mlp, _shift(mlp, i)]
    for key in sorted(state):
        t = state[key]
        if ".qkv_proj." in key:
            t = torch.cat([t[s] for s in qkv])
        elif ".gate_up_proj." in key:
            t = torch.cat([t[s] for s in gate_up])
        elif key.endswith("o_proj.weight"):
            t = t[:, q]
        elif key.endswith("down_proj.weight"):
            t = t[:, mlp]
        elif key.endswith(("o_proj.bias", "down_proj.bias")) and tp.rank:
            t = torch.zeros_like(t)  # a partial sum: the checkpoint's bias is added once, by rank 0
        yield key, t.detach().contiguous()


def _rows(heads: slice, d: int) -> slice:
    return slice(heads.start * d, heads.stop * d)


def _shift(s: slice, by: int) -> slice:
    return slice(s.start + by, s.stop + by)


def graph_logits(model: PagedLM, hidden: torch.Tensor, tp: TensorParallel) -> torch.Tensor | None:
    """The fp32 logits ``[N, V]`` of ``hidden`` on rank 0, ``None`` on the others, which take part: with ``n > 1``
    ranks and ``V % n == 0`` every rank forms its ``V/n`` rows (``PagedLM.vocab_logits``, model dtype) and one
    all-gather brings them to rank 0 (the same bytes as rank 0's full product: one rounding to the model dtype,
    then fp32); else rank 0 forms them alone. Every rank must call it at the same point (a collective)."""
    vocab = model.config.vocab_size
    if tp.size == 1 or vocab % tp.size:
        return model.compute_logits(hidden) if tp.rank == 0 else None
    local = model.vocab_logits(hidden, tp.q_heads(vocab)).contiguous()  # vocabulary rows split like heads of width 1
    n, part = local.shape
    parts = local.new_empty(tp.size * n, part)  # rank r's rows at [r n, (r + 1) n)
    _all_gather_single(parts, local, group=tp.group)
    return parts.view(tp.size, n, part).permute(1, 0, 2).reshape(n, vocab).float() if tp.rank == 0 else None


class RowParallelLinear(nn.Linear):
    """``nn.Linear`` over this rank's input columns; the ranks' partial outputs are summed (one all-reduce), or
    with ``defer`` left for the next norm to sum where ``tp.fuses`` them (a :class:`ReducingRMSNorm`)."""

    issues_own_prefetch = True  # oscarkv.models.prefetch: between the GEMV and the all-reduce

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel, bias: bool = True,
                 defer: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.tp, self.defer = tp, defer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        issue(self)
        return y if self.defer and self.tp.fuses(y) else self.tp.all_reduce(y)


class ReducingRMSNorm(RMSNorm):
    """The norm after a deferring :class:`RowParallelLinear`: where ``tp.fuses`` its input (and a residual
    comes with it: not layer 0's embeddings), the sum over the ranks, the residual add and the norm in one
    kernel (:func:`oscarkv.kernels.allreduce_norm.all_reduce_rms_norm`); else :meth:`RMSNorm.add_norm`."""

    def __init__(self, dim: int, eps: float, tp: TensorParallel) -> None:
        super().__init__(dim, eps)
        self.tp = tp

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None or not self.tp.fuses(x):
            return super().add_norm(x, residual)
        from oscarkv.kernels.allreduce_norm import all_reduce_rms_norm

        return all_reduce_rms_norm(x, residual, self.weight, self.eps, self.tp.reduce.peers)


def sharded_model(config, tp: TensorParallel, dtype: torch.dtype, device: torch.device | str) -> PagedLM:
    """A :class:`PagedLM` of one rank's shape, its ``o_proj`` and ``down_proj`` row parallel over ``tp``;
    its weights are still to be written (:func:`rank_tensors`, in the order of ``sorted(state_dict())``)."""
    with torch.device(device):
        model = PagedLM(shard_config(config, tp))
        defer = isinstance(model.model, Backbone)  # Llama-style: every projection's output goes to a norm next
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.o_proj = RowParallelLinear(attn.o_proj.in_features, attn.o_proj.out_features, tp, defer=defer)
            mlp.down_proj = RowParallelLinear(mlp.down_proj.in_features, mlp.down_proj.out_features, tp,
                                              mlp.down_proj.bias is not None, defer)
        if defer:
            _reducing_norms(model, tp)
    return model.to(dtype).eval().requires_grad_(False)


def _reducing_norms(model: PagedLM, tp: TensorParallel) -> None:
    """The norms that follow a row-parallel projection become :class:`ReducingRMSNorm` (same parameter)."""
    def swap(owner: nn.Module, name: str) -> None:
        old = getattr(owner, name)
        setattr(owner, name, ReducingRMSNorm(old.weight.shape[0], old.eps, tp))
    for layer in model.model.layers:
        swap(layer, "input_layernorm")  # layer 0's gets the embeddings (no residual): never fused
        swap(layer, "post_attention_layernorm")
    swap(model.model, "norm")


def shard_codecs(layers: tuple[LayerCodec, ...] | list[LayerCodec], num_kv_heads: int,
                 tp: TensorParallel) -> list[LayerCodec]:
    """The codecs of this rank's KV heads: rows of every per-head tensor (rotation, mean, inverse)."""
    heads = tp.kv_heads(num_kv_heads)

    def cut(c: TensorCodec) -> TensorCodec:
        c = replace(c, **{f: getattr(c, f)[heads].clone() for f in ("rotation", "mean", "inverse")
                          if getattr(c, f) is not None})
        if not c.head_bits:
            return c
        bits = c.head_bits[heads]  # a per-head allocation: this rank's heads' bits
        return replace(c, head_bits=bits) if len(set(bits)) > 1 else with_bits(replace(c, head_bits=()), bits[0])
    return [LayerCodec(cut(layer.key), cut(layer.value)) for layer in layers]
