"""Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE written for paged attention: one implementation, flat token batches.

Role: the engine's model. Activations are ``[T, hidden]`` for the ``T`` tokens of a step (all
sequences concatenated, vLLM style); attention is delegated to the step's
:class:`~oscarkv.attention.step.StepContext`, which writes K/V into the paged mixed cache
and attends over it. The families differ only in what the config says, dispatched on
``config.architectures[0]`` (never on a name):

* ``LlamaForCausalLM``: ``attention_bias`` on q/k/v/o, ``mlp_bias`` on the MLP;
* ``MistralForCausalLM``: Llama's layers without biases (a config with a sliding window shorter
  than its context is refused by the loader);
* ``Qwen2ForCausalLM``: bias on q/k/v, none on o;
* ``Qwen3ForCausalLM``: ``attention_bias`` on q/k/v/o, plus RMS QK-norm over ``head_dim``
  before RoPE;
* ``Qwen3MoeForCausalLM``: Qwen3's attention; the MLP of its sparse layers is top-k routed
  experts (:class:`~oscarkv.models.moe.SparseMoE`, grouped GEMMs).

Parameter names follow transformers (``model.layers.{i}.self_attn.o_proj.weight`` ...) except
for two stacked projections, ``qkv_proj`` (q, k, v) and ``gate_up_proj`` (gate, up): one GEMV
each per decode step instead of three and two. :meth:`PagedLM.from_hf` loads the state dict of
the model that :func:`oscarkv.models.loader.load_model` returns (HF directory or GGUF),
concatenating those tensors on the way (:func:`fuse_state_dict`). ``o_proj`` always has
a bias: zero unless the config has one, it receives the folded value mean
(:mod:`oscarkv.models.folding`). :meth:`PagedLM.random` builds random weights from a config
(benchmarks at real shapes without downloads, ``oscarkv.models.shapes``).

On CUDA the elementwise work runs as the fused Triton kernels of :mod:`oscarkv.kernels.fused`
(RMSNorm with the residual add folded in, QK-norm + RoPE of the q and k heads in place in the
qkv output, SiLU·mul of the stacked gate/up output), one launch where PyTorch needs 5–10; the
residual stream is carried vLLM style (``forward_fused``: each layer hands its MLP output and
the un-added residual to the next norm). QK-norm + RoPE is first offered to the step context
as a :class:`~oscarkv.attention.step.QKRope` (``StepContext.attention_from_qkv``): an
attention backend that fuses it with its own input maps (OSCAR decode steps) takes the
un-roped qkv output instead. Every other device runs the PyTorch expressions below, which
are those kernels' oracles.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from oscarkv.attention.step import QKRope
from oscarkv.models.loader import check_config
from oscarkv.models.moe import SparseMoE, is_sparse_layer


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


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _biases(config) -> tuple[bool, bool, bool]:
    """(q/k/v bias, o bias, QK-norm) for the config's architecture."""
    arch = check_config(config, "paged model")
    bias = bool(getattr(config, "attention_bias", False))
    if arch == "Qwen2ForCausalLM":
        return True, False, False
    return bias, bias, arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


class Attention(nn.Module):
    """Projections, QK-norm and RoPE; the attention itself is the step context's.

    ``qkv_proj`` holds q, k and v stacked along the output dimension (``[(Hq + 2H) d, D]``, one
    GEMV per step instead of three; :func:`fuse_state_dict` builds it from the checkpoint)."""

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
        if x.is_cuda:
            o = self._attention_fused(qkv, self._qk_rope(cos, sin), step)
        else:
            q, k, v = qkv.split((Hq, H, H), dim=1)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, d]
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            o = step.attention(self.layer_idx, q, k, v)
        return self.o_proj(o.to(x.dtype).reshape(T, -1))  # o: [T, Hq, d] fp32 or x's dtype, rotated value domain

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
        if x.is_cuda:
            from oscarkv.kernels.fused import silu_mul

            return self.down_proj(silu_mul(gu))
        gate, up = gu.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        moe = config.architectures[0] == "Qwen3MoeForCausalLM" and is_sparse_layer(config, layer_idx)
        self.mlp = SparseMoE(config) if moe else MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, step)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                      sin: torch.Tensor, step) -> tuple[torch.Tensor, torch.Tensor]:
        """CUDA: ``x`` is the previous layer's MLP output (the embeddings for layer 0, ``residual``
        then ``None``), not yet added to ``residual``; returns (this MLP's output, residual)."""
        from oscarkv.kernels.fused import rms_norm

        h, residual = rms_norm(x, self.input_layernorm.weight, self.input_layernorm.eps, residual)
        a = self.self_attn(h, cos, sin, step)
        h, residual = rms_norm(a, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps, residual)
        return self.mlp(h), residual


class Backbone(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)  # transformers' inv_freq (incl. rope scaling)


class PagedLM(nn.Module):
    """A causal LM over flat token batches: ``forward(ids [T], positions [T], step) -> hidden [T, D]``."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def head_dim(self) -> int:
        return self.model.layers[0].self_attn.head_dim

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, step) -> torch.Tensor:
        x = self.model.embed_tokens(ids)  # [T, D]
        cos, sin = self.model.rotary_emb(x, positions.unsqueeze(0))  # [1, T, d] each
        if x.is_cuda:
            from oscarkv.kernels.fused import rms_norm

            residual = None
            for layer in self.model.layers:
                x, residual = layer.forward_fused(x, residual, cos[0], sin[0], step)
            return rms_norm(x, self.model.norm.weight, self.model.norm.eps, residual)[0]
        for layer in self.model.layers:
            x = layer(x, cos[0], sin[0], step)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` → fp32 logits ``[N, V]``."""
        return self.lm_head(hidden).float()

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> PagedLM:
        """Copy the weights of a transformers model of a supported architecture."""
        p = next(hf_model.parameters())
        model = cls(hf_model.config).to(dtype=p.dtype, device=p.device)
        state = fuse_state_dict({k: v for k, v in hf_model.state_dict().items() if "rotary_emb" not in k})
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("o_proj.bias") and "rotary_emb" not in k]
        if missing or unexpected:
            raise ValueError(f"PagedLM.from_hf: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for layer in model.model.layers:
            if not layer.self_attn.has_o_bias:  # not in the checkpoint: zero until a value mean is folded in
                nn.init.zeros_(layer.self_attn.o_proj.bias)
        return model.eval().requires_grad_(False)

    @classmethod
    def random(cls, config, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               seed: int = 0) -> PagedLM:
        """Random weights at the config's shapes (``initializer_range`` normal, zero biases, unit norms)."""
        torch.manual_seed(seed)
        with torch.device(device):
            model = cls(config)
        std = getattr(config, "initializer_range", 0.02)
        for name, p in model.named_parameters():
            if "norm" in name:
                nn.init.ones_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=std)
        return model.to(dtype).eval().requires_grad_(False)
