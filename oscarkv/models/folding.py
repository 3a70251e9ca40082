"""Fold the value rotation R_V and mean mu_V into ``v_proj`` and ``o_proj`` (DESIGN.md §1).

Role: make the model produce and consume rotated values, so the engine stores values with no
runtime rotation. Math convention ``y = x W`` (``nn.Linear`` stores ``Wᵀ``). For KV head
``h`` and each query head ``g`` of its group:

    v_proj:  W_v[:, h] <- W_v[:, h] R_V[h]            (bias b_v[h] <- b_v[h] R_V[h]; the v rows of qkv_proj)
    o_proj:  W_o[g]    <- R_V[h]⁻¹ W_o[g]             (the rows of head g; R⁻¹ = Rᵀ unless scaled)
    o_proj bias        += sum_g mu_V[h(g)] W_o[g]     (attention scores sum to 1)

The engine then stores ``v R_V - mu_V R_V`` — :func:`folded_value_codec`, a codec with no
rotation and the rotated mean, i.e. exactly ``TensorCodec.to_rotated`` of the unfolded value —
and attention outputs in that domain feed the folded ``o_proj`` unchanged. Products are
formed in fp64 and cast back to the parameter dtype.
"""

from __future__ import annotations

import logging

import torch

from oscarkv.quant.codec import TensorCodec

log = logging.getLogger(__name__)


def fold_layer(attn, value: TensorCodec) -> None:
    """Fold one layer's value codec (rotation ``[H, d, d]``, mean ``[H, d]``) into ``attn`` in place. Folding the
    maps folded already does nothing (a second engine built from the same PagedLM and artifact); other maps over
    folded ones (or none: :func:`fold_values`) would make the outputs wrong, and it says so."""
    done = getattr(attn, "folded_value", None)  # NOTE: in place: the maps some engine folded earlier, their head order
    order = getattr(attn, "kv_order", None) or list(range(attn.num_kv_heads))
    if done is not None:
        before, at = done
        if not _same_maps(before.permute_heads([at.index(h) for h in order]), value):  # in the heads' order now
            log.warning("fold_layer: this layer's value maps were folded already (another engine built from the same "
                        "PagedLM, another artifact); its outputs will be wrong: give each engine its own model "
                        "(copy.deepcopy)")
        return
    if value.rotation is None and value.mean is None:
        return
    attn.folded_value = value, order
    H, d, rep = attn.num_kv_heads, attn.head_dim, attn.num_heads // attn.num_kv_heads
    qkv = attn.qkv_proj
    eye = torch.eye(d, dtype=torch.float64, device=qkv.weight.device).expand(H, d, d)
    r = value.rotation.double() if value.rotation is not None else eye
    with torch.no_grad():
        wv, wo = qkv.weight[attn.v_rows], attn.o_proj.weight  # [H d, D] (a view into qkv_proj), [D, Hq d]
        w = wv.double().view(H, d, -1)  # rows of head h: W_v[:, h]ᵀ
        wv.copy_(torch.einsum("hde,hdk->hek", r, w).reshape(wv.shape))  # R_hᵀ W_v[:, h]ᵀ
        if qkv.bias is not None:
            bv = qkv.bias[attn.v_rows]
            bv.copy_(torch.einsum("hd,hde->he", bv.double().view(H, d), r).reshape(-1))
        wo_h = wo.double().view(wo.shape[0], H, rep, d)  # [D, H, rep, d]: columns of query head g
        if value.mean is not None:
            mean = value.mean.double().to(wo.device)  # [H, d]
            attn.o_proj.bias.add_(torch.einsum("khrd,hd->k", wo_h, mean).to(wo.dtype))
        r_inv_t = value.query_map().double() if value.rotation is not None else r  # R_h⁻ᵀ
        wo.copy_(torch.einsum("khrd,hde->khre", wo_h, r_inv_t).reshape(wo.shape))  # W_o[g]ᵀ R_h⁻ᵀ


def _same_maps(a: TensorCodec, b: TensorCodec) -> bool:
    """Whether two value codecs fold the same maps (rotation, inverse, mean)."""
    def same(x, y):
        return (x is None) == (y is None) and (x is None or torch.equal(x.cpu(), y.cpu()))
    return same(a.rotation, b.rotation) and same(a.inverse, b.inverse) and same(a.mean, b.mean)


def folded_value_codec(value: TensorCodec) -> TensorCodec:
    """The storage codec after folding: no rotation, mean ``mu_V R_V`` (rotated domain)."""
    if value.rotation is None:
        return value
    mean = None if value.mean is None else torch.einsum("hd,hde->he", value.mean.double(),
                                                       value.rotation.double()).float()
    return TensorCodec(value.bits, value.group, None, mean, value.clip, value.per_channel,
                       levels=value.levels)  # no inverse left


def permute_kv_heads(attn, order: list[int]) -> None:
    """Reorder ``attn``'s KV heads in place: head ``order[j]`` becomes head ``j``, its query heads, k and v rows
    (weights and biases of ``qkv_proj``) and ``o_proj`` columns with it — an exact reparametrization (attention is
    per head; QK-norm weights are shared by the heads). A per-head key allocation uses it so that the heads of one
    bit width form a contiguous range (``oscarkv.cache.kv_pools.HeadPart``). ``order`` names the heads as loaded: on
    a layer permuted before (a second engine of one PagedLM) only what is left to reach ``order`` is applied."""
    done = getattr(attn, "kv_order", None)  # head j of the layer is head done[j] as loaded
    attn.kv_order = list(order)
    if done is not None:
        order = [done.index(h) for h in order]
    if order == list(range(len(order))):  # nothing left to move
        return
    H, d, rep = attn.num_kv_heads, attn.head_dim, attn.num_heads // attn.num_kv_heads
    dev = attn.qkv_proj.weight.device
    kv = torch.tensor(order, device=dev)
    qh = (kv[:, None] * rep + torch.arange(rep, device=dev)).reshape(-1)  # query heads in their new order
    cols = torch.arange(d, device=dev)

    def rows(heads: torch.Tensor, base: int) -> torch.Tensor:
        return (base + heads[:, None] * d + cols).reshape(-1)
    q_rows = rows(qh, 0)
    perm = torch.cat([q_rows, rows(kv, rep * H * d), rows(kv, (rep + 1) * H * d)])
    with torch.no_grad():
        qkv = attn.qkv_proj
        qkv.weight.copy_(qkv.weight[perm])
        if qkv.bias is not None:
            qkv.bias.copy_(qkv.bias[perm])
        attn.o_proj.weight.copy_(attn.o_proj.weight[:, q_rows])


def fold_values(model, codecs) -> list[TensorCodec]:
    """Fold every layer of a :class:`~oscarkv.models.llama.PagedLM`; returns the storage value codecs."""
    out = []
    for layer, codec in zip(model.model.layers, codecs):
        fold_layer(layer.self_attn, codec.value)
        out.append(folded_value_codec(codec.value))
    return out
