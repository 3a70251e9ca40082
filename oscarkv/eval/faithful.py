"""Decode-faithful attention: one teacher-forced pass in which every position attends to the
history exactly as token-by-token decoding would see it.

For query position ``i`` the sequence holds ``t = i + 1`` tokens; key ``j`` is read from the
tier :func:`~oscarkv.quant.bpe.history_end` assigns it at that length: the token itself at
full precision (it is the current chunk), the sink and recent window as BF16-rounded rotated
values mapped back, the history through the low-bit codec applied to those BF16 values. Every stored version comes from
the codec (``oscarkv.quant.codec``), so the simulation uses the same numbers as the caches.

The function is registered as the transformers attention implementation ``"oscarkv_faithful"``
and receives the :class:`~oscarkv.quant.codec.KVCodec` through the model call's keyword
``oscar_codec``; :func:`faithful_logits` wraps that. Its output feeds the perplexity task.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from oscarkv.kernels.reference import banded_attention
from oscarkv.quant.bpe import history_end
from oscarkv.quant.codec import KVCodec, TensorCodec

NAME = "oscarkv_faithful"
QUERY_BLOCK = 1024


def stored_versions(codec: TensorCodec, x: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [B, H, T, d]`` → (low-bit version, BF16-window version), both fp32, original domain."""
    # NOTE: history pages are encoded from the BF16-rounded rotated values, as the caches do,
    # so a page is a pure function of its tokens however they were chunked.
    rot = torch.stack([codec.to_rotated(row.transpose(0, 1)) for row in x]).bfloat16().float()  # [B, T, H, d]
    bf = codec.from_rotated(rot.flatten(0, 1)).unflatten(0, rot.shape[:2])
    low = torch.stack([_low_row(codec, r, page) for r in rot])
    return low.transpose(1, 2), bf.transpose(1, 2)


def _low_row(codec: TensorCodec, rot: torch.Tensor, page: int) -> torch.Tensor:
    if not codec.per_channel:
        return codec.from_rotated(codec.decode(codec.encode(rot)))
    # KIVI: quantize each full token block; a trailing partial block is never in history.
    out = codec.from_rotated(rot).clone()  # from_rotated may return a view of rot
    full = rot.shape[0] // page * page
    for s in range(0, full, page):
        out[s:s + page] = codec.from_rotated(codec.decode(codec.encode(rot[s:s + page])))
    return out


def _tier_masks(t: int, q0: int, q1: int, codec: KVCodec, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean ``[q1 - q0, t]`` masks: key j in low-bit history for query i; key j visible (j <= i)."""
    c = codec.config
    ends = torch.tensor([history_end(i + 1, c.sink, c.recent, c.page_size) for i in range(q0, q1)], device=device)
    j = torch.arange(t, device=device)
    low = (j[None, :] >= min(c.sink, t)) & (j[None, :] < ends[:, None])
    visible = j[None, :] <= torch.arange(q0, q1, device=device)[:, None]
    return low, visible


def faithful_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, oscar_codec=None, **kwargs):
    """Attention with per-(query, key) storage tiers; ``query [B, Hq, T, d]``, ``key/value [B, Hkv, T, d]``."""
    layer = oscar_codec.layers[module.layer_idx] if oscar_codec is not None else None
    if getattr(module, "sliding_window", None):  # a BF16 window (Gemma 3): its band, as computed (no mask is given)
        out = banded_attention(query, key, value, scaling, module.sliding_window)
        return out.transpose(1, 2).contiguous().to(query.dtype), None
    if layer is None or layer.key.bits is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    page = oscar_codec.config.page_size
    rep = query.shape[1] // key.shape[1]
    k_low, k_bf = (t.repeat_interleave(rep, 1) for t in stored_versions(layer.key, key, page))
    v_low, v_bf = (t.repeat_interleave(rep, 1) for t in stored_versions(layer.value, value, page))
    k_ex, v_ex = key.float().repeat_interleave(rep, 1), value.float().repeat_interleave(rep, 1)
    q = query.float() * scaling
    T = key.shape[2]
    outs = []
    for q0 in range(0, T, QUERY_BLOCK):
        q1 = min(T, q0 + QUERY_BLOCK)
        outs.append(_block(q[:, :, q0:q1], (k_low, k_bf, k_ex), (v_low, v_bf, v_ex), q0, oscar_codec))
    out = torch.cat(outs, dim=2).to(query.dtype)  # [B, Hq, T, d]
    return out.transpose(1, 2).contiguous(), None


def _block(q, ks, vs, q0, codec):
    (k_low, k_bf, k_ex), (v_low, v_bf, v_ex) = ks, vs
    q1, t = q0 + q.shape[2], k_low.shape[2]
    low, visible = _tier_masks(t, q0, q1, codec, q.device)
    rows = torch.arange(q1 - q0, device=q.device)
    s = torch.where(low, q @ k_low.transpose(-1, -2), q @ k_bf.transpose(-1, -2))
    s[..., rows, rows + q0] = (q * k_ex[:, :, q0:q1]).sum(-1)  # the token itself: current chunk
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
    p_diag = p[..., rows, rows + q0].clone()
    p[..., rows, rows + q0] = 0.0
    p_low = p * low
    return p_low @ v_low + (p - p_low) @ v_bf + p_diag.unsqueeze(-1) * v_ex[:, :, q0:q1]


AttentionInterface.register(NAME, faithful_attention)


@torch.inference_mode()
def faithful_logits(model, input_ids: torch.Tensor, codec: KVCodec) -> torch.Tensor:
    """Logits ``[B, T, V]`` of a teacher-forced, decode-faithful pass (restores the attention impl)."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = NAME
    try:
        return model(input_ids, use_cache=False, oscar_codec=codec).logits
    finally:
        model.config._attn_implementation = previous
