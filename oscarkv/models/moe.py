"""The mixture-of-experts MLP of ``Qwen3MoeForCausalLM``: top-k routing and grouped expert GEMMs.

Role: the MLP of a sparse layer of :class:`~oscarkv.models.llama.PagedLM` (``[T, D] -> [T, D]``).
The router (``gate``, ``[E, D]``) picks ``k`` experts per token from a float32 softmax,
renormalized over the chosen ``k`` when ``norm_topk_prob`` — as transformers does. The experts'
weights are stacked as transformers stores them: ``experts.gate_up_proj [E, 2I, D]`` (gate rows
first) and ``experts.down_proj [E, D, I]``.

The expert computation is grouped, not a Python loop over experts: the ``T·k`` (token, expert)
assignments are sorted by expert and scattered into a buffer ``[E, C, D]`` (``C``: the most
tokens any expert got this step, the rest zero padding), two batched matmuls run every expert
at once, and each assignment's output, weighted by its routing probability, is added back to its
token. Correct first: the padding computes ``E·C`` rows where ``T·k`` are needed (MoE speed is
not a target here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def is_sparse_layer(config, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` of a Qwen3-MoE config has experts (transformers' rule)."""
    return (layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
            and config.num_experts > 0 and (layer_idx + 1) % config.decoder_sparse_step == 0)


class Experts(nn.Module):
    """The stacked expert weights (transformers' parameter names and layout)."""

    def __init__(self, config) -> None:
        super().__init__()
        E, D, I = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, D))
        self.down_proj = nn.Parameter(torch.empty(E, D, I))


class SparseMoE(nn.Module):
    """Top-k routed SwiGLU experts over a flat token batch."""

    def __init__(self, config) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [T, k] in x's dtype, expert ids [T, k])``."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)  # [T, k]
        E, k = self.experts.gate_up_proj.shape[0], self.top_k
        expert = ids.flatten()  # [T k]
        order = expert.argsort(stable=True)  # assignments grouped by expert
        counts = torch.bincount(expert, minlength=E)
        starts = counts.cumsum(0) - counts
        slot = torch.arange(order.numel(), device=x.device) - starts[expert[order]]  # place within its group
        token = order // k
        buf = x.new_zeros(E, int(counts.max()), x.shape[-1])  # [E, C, D]
        buf[expert[order], slot] = x[token]
        gate, up = torch.bmm(buf, self.experts.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)  # [E, C, I] each
        out = torch.bmm(F.silu(gate) * up, self.experts.down_proj.transpose(1, 2))  # [E, C, D]
        y = out[expert[order], slot] * weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, token, y)
