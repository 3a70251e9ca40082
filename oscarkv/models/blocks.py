"""The building blocks every paged architecture shares: stacked projections, RMSNorm, attention, SwiGLU.

Role: the layers :mod:`oscarkv.models.llama` (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE) and
:mod:`oscarkv.models.gemma` (Gemma 3) assemble. Activations are ``[T, hidden]`` for the ``T``
tokens of a step; attention is delegated to the step's
:class:`~oscarkv.attention.step.StepContext`. On CUDA, :class:`Attention`, :class:`RMSNorm` and
:class:`MLP` run the fused Triton kernels of :mod:`oscarkv.kernels.fused` (see
:mod:`oscarkv.models.llama`); every other device runs the PyTorch expressions here, which are
those kernels' oracles.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oscarkv.attention.step import QKRope
from oscarkv.models.loader import check_config
from oscarkv.models.prefetch import after_gemv


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""Stacked projections of :class:`PagedLM` and the checkpoint's tensors they concatenate (in order)."""


def fuse_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers state dict with q/k/v and gate/up weights (and biases) concatenated along
    the output dimension into the ``qkv_proj`` / ``gate_up_proj`` entries of :data:`FUSED`."""
    out = dict(state)
    for key in state:
        for fused, parts in FUSED.items():
            prefix, dot, rest = key.rpartition(f".{parts[0]}.")  # "...self_attn", ".q_proj.", "weight"
            if dot:
                names = [f"{prefix}.{p}.{rest}" for p in parts]
                out[f"{prefix}.{fused}.{rest}"] = torch.cat([out.pop(n) for n in names])
    return out


class RMSNorm(nn.Module):
    """transformers' RMSNorm, operation for operation (fp32 statistics, weight in the model dtype)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from oscarkv.kernels.fused import rms_norm

            return rms_norm(x.reshape(-1, x.shape[-1]), self.weight, self.eps)[0].view(x.shape)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """CUDA, ``[T, D]``: ``(norm(x + residual), x + residual)`` in one kernel (``residual`` None: ``x`` alone;
        :func:`oscarkv.kernels.fused.rms_norm`). A tensor-parallel model's may also sum ``x`` over the ranks."""
        from oscarkv.kernels.fused import rms_norm

        return rms_norm(x, self.weight, self.eps, residual)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _biases(config) -> tuple[bool, bool, bool]:
    """(q/k/v bias, o bias, QK-norm) for the config's architecture."""
    arch = check_config(config, "paged model")
    bias = bool(getattr(config, "attention_bias", False))
    if arch == "Qwen2ForCausalLM":
        return True, False, False
    return bias, bias, arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM")


class Attention(nn.Module):
    """Projections, QK-norm and RoPE; the attention itself is the step context's.

    ``qkv_proj`` holds q, k and v stacked along the output dimension (``[(Hq + 2H) d, D]``, one
    GEMV per step instead of three; :func:`fuse_state_dict` builds it from the checkpoint)."""

    fused_kernels = True
    """Whether CUDA runs the fused QK-norm + RoPE kernels (Llama-style norms; Gemma's are not)."""

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        qkv_bias, o_bias, qk_norm = _biases(config)
        D, d = config.hidden_size, self.head_dim
        self.qkv_proj = nn.Linear(D, (self.num_heads + 2 * self.num_kv_heads) * d, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, D, bias=True)  # the bias takes the folded value mean
        self.has_o_bias = o_bias
        self.q_norm = RMSNorm(d, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps) if qk_norm else None

    @property
    def v_rows(self) -> slice:
        """Rows of ``qkv_proj`` that produce v (``oscarkv.models.folding`` rewrites them)."""
        return slice((self.num_heads + self.num_kv_heads) * self.head_dim, None)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step) -> torch.Tensor:
        T, d, Hq, H = x.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(T, Hq + 2 * H, d)  # [T, Hq + 2H, d]
        after_gemv(self.qkv_proj)  # EngineConfig.l2_prefetch (oscarkv.models.prefetch): o_proj's weights
        if x.is_cuda and self.fused_kernels:
            o = self._attention_fused(qkv, self._qk_rope(cos, sin), step)
        else:
            q, k, v = qkv.split((Hq, H, H), dim=1)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, d]
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            o = step.attention(self.layer_idx, q, k, v)
        out = self.o_proj(o.to(x.dtype).reshape(T, -1))  # o: [T, Hq, d] fp32 or x's dtype, rotated value domain
        after_gemv(self.o_proj)
        return out

    def _qk_rope(self, cos: torch.Tensor, sin: torch.Tensor) -> QKRope:
        """This layer's QK-norm (if any) and RoPE at ``cos, sin [T, d]``, for the step context or the kernel."""
        norm = self.q_norm is not None
        return QKRope(self.num_heads, cos, sin, self.q_norm.weight if norm else None,
                      self.k_norm.weight if norm else None, self.q_norm.eps if norm else 0.0)

    def _attention_fused(self, qkv: torch.Tensor, rope: QKRope, step) -> torch.Tensor:
        """CUDA: the step context takes the un-roped ``qkv`` if its backend fuses ``rope`` into its own
        input maps (OSCAR decode steps); else QK-norm + RoPE in place in ``qkv`` (one launch), then attention."""
        o = step.attention_from_qkv(self.layer_idx, qkv, rope)
        if o is not None:
            return o
        from oscarkv.kernels.fused import qk_norm_rope_

        Hq, H = self.num_heads, self.num_kv_heads
        qk_norm_rope_(qkv[:, : Hq + H], rope.num_q, rope.q_weight, rope.k_weight, rope.cos, rope.sin, rope.eps)
        q, k, v = qkv.split((Hq, H, H), dim=1)  # views: the kernels take strides
        return step.attention(self.layer_idx, q, k, v)


class MLP(nn.Module):
    """SwiGLU; ``gate_up_proj`` holds gate and up stacked (``[2I, D]``, one GEMV instead of two)."""

    def __init__(self, config) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        D, I = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Linear(D, 2 * I, bias=bias)
        self.down_proj = nn.Linear(I, D, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up_proj(x)  # [T, 2I]
        after_gemv(self.gate_up_proj)
        if x.is_cuda:
            from oscarkv.kernels.fused import silu_mul

            h = silu_mul(gu)
        else:
            gate, up = gu.chunk(2, dim=-1)
            h = F.silu(gate) * up
        out = self.down_proj(h)
        after_gemv(self.down_proj)
        return out
