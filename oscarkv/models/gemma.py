"""Gemma 3 (``Gemma3ForCausalLM``, the text model) for paged attention, on the shared blocks.

Role: the backbone :class:`~oscarkv.models.llama.PagedLM` builds when ``config.architectures[0]``
is ``Gemma3ForCausalLM`` (``transformers.Gemma3TextConfig``). What differs from Llama, as
transformers' ``modeling_gemma3`` computes it:

* the embeddings are multiplied by ``sqrt(hidden_size)`` rounded to the weight dtype;
* every RMSNorm scales by ``1 + weight`` in fp32 and rounds once (:class:`GemmaRMSNorm`), the q and
  k heads included (QK-norm before RoPE);
* four norms per layer: the attention output and the MLP output are normed (``post_attention_``,
  ``post_feedforward_layernorm``) before each residual add, the MLP input by ``pre_feedforward_``;
* the MLP is gelu(tanh)·up (``hidden_activation = gelu_pytorch_tanh``);
* the softmax scale is ``query_pre_attn_scalar ** -0.5`` (:attr:`PagedLM.attention_scale`);
* RoPE per layer type: ``rope_parameters["sliding_attention"]`` (the local base) on the sliding
  layers, ``["full_attention"]`` on the global ones (transformers' ``Gemma3RotaryEmbedding``);
* ``final_logit_softcapping`` (when set) caps the logits (:meth:`PagedLM.compute_logits`);
  ``attn_logit_softcapping`` and bidirectional attention are refused by the loader.

Which layers are sliding (``layer_types``) and their window (``sliding_window``) is the step
context's business, not the model's: a sliding layer's K/V go to the bounded window store and its
attention is banded (:class:`~oscarkv.quant.bpe.SlidingLayers`, ``oscarkv.cache.window``).

NOTE: these layers run their PyTorch expressions on every device: the fused CUDA kernels of
:mod:`oscarkv.kernels.fused` implement Llama's norms (``weight * norm(x).to(dtype)``), not Gemma's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oscarkv.models.blocks import MLP, Attention


class GemmaRMSNorm(nn.Module):
    """transformers' ``Gemma3RMSNorm``: ``(norm(x.float()) * (1 + weight.float())).to(x.dtype)``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GemmaAttention(Attention):
    """The shared attention with Gemma's QK-norms, never the fused CUDA path (see the module docstring)."""

    fused_kernels = False

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)


class GemmaMLP(MLP):
    """gelu(tanh)(gate) · up, then down (``gate_up_proj`` stacked as in :class:`MLP`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [T, I] each
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        D, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = GemmaAttention(config, layer_idx)
        self.mlp = GemmaMLP(config)
        self.input_layernorm = GemmaRMSNorm(D, eps)
        self.post_attention_layernorm = GemmaRMSNorm(D, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(D, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(D, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, step))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class GemmaBackbone(nn.Module):
    """Embeddings, layers and final norm: ``forward(ids [T], positions [T], step) -> hidden [T, D]``."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

        D = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, D)
        self.embed_scale = D ** 0.5
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(D, config.rms_norm_eps)
        self.rotary_emb = Gemma3RotaryEmbedding(config)  # transformers' inv_freq per layer type
        self.layer_types = list(config.layer_types)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, step) -> torch.Tensor:
        w = self.embed_tokens.weight
        x = self.embed_tokens(ids) * torch.tensor(self.embed_scale, device=w.device).to(w.dtype)  # [T, D]
        rope = {t: self.rotary_emb(x, positions.unsqueeze(0), t) for t in set(self.layer_types)}  # [1, T, d] each
        for layer, kind in zip(self.layers, self.layer_types):
            cos, sin = rope[kind]
            x = layer(x, cos[0], sin[0], step)
        return self.norm(x)
