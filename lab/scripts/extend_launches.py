"""Launches of an eager extend step, counted on the CPU (issue 29): the first step of a follow-up request (k new
tokens over a cached prefix) on a tiny Qwen3 through the Triton backend (``TRITON_INTERPRET=1``), every ATen op
(a ``TorchDispatchMode``) and every Triton launch counted, those inside ``StepContext.attention`` apart.

NOTE: on the CPU the model's own layers take their PyTorch branches (RMSNorm, RoPE, SwiGLU: fused kernels on
CUDA), so only the attention column matches what a GPU launches; views (``aten.view``, ``aten.t`` ...) launch
nothing and are left out. Per layer = per step / layers.

    TRITON_INTERPRET=1 PYTHONPATH=. python -m lab.scripts.extend_launches --new-tokens 1,8,64
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen3Config

VIEWS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "select", "slice",
         "split", "split_with_sizes", "unbind", "alias", "as_strided", "detach", "reshape", "lift_fresh", "empty",
         "empty_strided", "_local_scalar_dense", "sym_size", "sym_stride", "is_same_size", "chunk"}


CONFIG = Qwen3Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=64, vocab_size=128, max_position_embeddings=4096,
                     architectures=["Qwen3ForCausalLM"])
CONTEXT = 1088  # past the split-K kernel's shortest prefix (1024): k <= 8 takes it, as at 100K on a GPU


class Launches(TorchDispatchMode):
    """Counts ATen ops by name, split by whether ``StepContext.attention`` is running."""

    def __init__(self) -> None:
        super().__init__()
        self.ops, self.attention, self.triton = Counter(), False, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS and not self.triton:  # NOTE: the interpreter's own copies are no launches
            self.ops[("attention" if self.attention else "model", name)] += 1
        return func(*args, **(kwargs or {}))


def count(k: int, method: str) -> Counter:
    from oscarkv.attention import step as step_mod
    from oscarkv.attention.backends import TritonAttention
    from oscarkv.bench.followup import _ids, cache_prefix, followup_engine, followup_step
    from oscarkv.models.llama import PagedLM
    import triton.runtime.interpreter as interp

    engine = followup_engine(PagedLM.random(CONFIG).to(torch.bfloat16), method, 1 << 24, 64)
    engine.runner.inner.backend = engine.runner.backend = TritonAttention()
    prefix = _ids(engine, CONTEXT, CONTEXT)
    cache_prefix(engine, prefix)
    mode, run, attn = Launches(), interp.InterpretedFunction.run, step_mod.StepContext.attention

    def counted_run(self, *a, **kw):
        mode.ops[("attention" if mode.attention else "model", "triton:" + self.fn.__name__)] += 1
        mode.triton = True
        try:
            return run(self, *a, **kw)
        finally:
            mode.triton = False

    def counted_attention(self, *a, **kw):
        mode.attention = True
        try:
            return attn(self, *a, **kw)
        finally:
            mode.attention = False

    interp.InterpretedFunction.run, step_mod.StepContext.attention = counted_run, counted_attention
    try:
        with mode:
            followup_step(engine, prefix, k, seed=k)
    finally:
        interp.InterpretedFunction.run, step_mod.StepContext.attention = run, attn
        engine.close()
    return mode.ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", default="1,8,64")
    ap.add_argument("--methods", default="oscar,bf16")
    a = ap.parse_args()
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 (Triton kernels on the CPU)"
    layers = CONFIG.num_hidden_layers
    for method in a.methods.split(","):
        for k in (int(x) for x in a.new_tokens.split(",")):
            ops = count(k, method)
            att = {n: c for (w, n), c in ops.items() if w == "attention"}
            print(f"{method} k={k}: attention {sum(att.values()) / layers:.1f} launches per layer "
                  f"(model, CPU branches: {sum(c for (w, _), c in ops.items() if w == 'model')} per step)")
            print("   " + ", ".join(f"{n} {c / layers:g}" for n, c in sorted(att.items(), key=lambda x: -x[1])), flush=True)


if __name__ == "__main__":
    main()
