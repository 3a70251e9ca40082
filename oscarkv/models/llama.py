"""Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE and Gemma 3 written for paged attention, flat token batches.

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
  experts (:class:`~oscarkv.models.moe.SparseMoE`, grouped GEMMs);
* ``Gemma3ForCausalLM``: its own backbone on the same blocks (:mod:`oscarkv.models.gemma`: scaled
  embeddings, ``1 + weight`` norms, four norms per layer, gelu MLP, RoPE per layer type, soft-capped
  logits); its sliding-window layers are the step context's to window.

The shared blocks (stacked projections, RMSNorm, attention, SwiGLU) live in
:mod:`oscarkv.models.blocks`.

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
from torch import nn
from torch.nn import functional as F

from oscarkv.models.blocks import FUSED, MLP, Attention, RMSNorm, fuse_state_dict, rotate_half  # noqa: F401 (re-exported)
from oscarkv.models.gemma import GemmaBackbone
from oscarkv.models.moe import SparseMoE, is_sparse_layer
from oscarkv.models import prefetch

GEMMA = "Gemma3ForCausalLM"


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
        then ``None``), not yet added to ``residual``; returns (this MLP's output, residual). Under tensor
        parallelism the outputs may be the ranks' partial sums, summed by the next norm
        (``oscarkv.models.parallel.ReducingRMSNorm``)."""
        h, residual = self.input_layernorm.add_norm(x, residual)
        a = self.self_attn(h, cos, sin, step)
        h, residual = self.post_attention_layernorm.add_norm(a, residual)
        return self.mlp(h), residual


class Backbone(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)  # transformers' inv_freq (incl. rope scaling)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, step) -> torch.Tensor:
        x = self.embed_tokens(ids)  # [T, D]
        cos, sin = self.rotary_emb(x, positions.unsqueeze(0))  # [1, T, d] each
        if x.is_cuda:
            residual = None
            for layer in self.layers:
                x, residual = layer.forward_fused(x, residual, cos[0], sin[0], step)
            prefetch.join(x.device)  # EngineConfig.l2_prefetch's side stream, if any
            return self.norm.add_norm(x, residual)[0]
        for layer in self.layers:
            x = layer(x, cos[0], sin[0], step)
        return self.norm(x)


class PagedLM(nn.Module):
    """A causal LM over flat token batches: ``forward(ids [T], positions [T], step) -> hidden [T, D]``."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.model = GemmaBackbone(config) if config.architectures[0] == GEMMA else Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def head_dim(self) -> int:
        return self.model.layers[0].self_attn.head_dim

    @property
    def attention_scale(self) -> float:
        """The softmax scale: ``query_pre_attn_scalar ** -0.5`` for Gemma 3, else ``head_dim ** -0.5``."""
        if self.config.architectures[0] == GEMMA:
            return self.config.query_pre_attn_scalar ** -0.5
        return self.head_dim ** -0.5

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, step) -> torch.Tensor:
        return self.model(ids, positions, step)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` → fp32 logits ``[N, V]`` (soft-capped as transformers does where the config sets
        ``final_logit_softcapping``: ``cap · tanh(logits / cap)`` in the model dtype)."""
        return self.vocab_logits(hidden, slice(None)).float()

    def vocab_logits(self, hidden: torch.Tensor, vocab: slice) -> torch.Tensor:
        """The logits of the vocabulary rows ``vocab`` in the model dtype, soft-capped: ``[N, len(vocab)]``
        (``compute_logits`` is all of them in fp32; tensor parallelism gathers each rank's rows)."""
        head = self.lm_head
        logits = F.linear(hidden, head.weight[vocab], None if head.bias is None else head.bias[vocab])
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

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
