"""Real model shapes for benchmarks without weights: Qwen3-4B, Qwen3-8B and Qwen3-32B configs, and the default
model's (SmolLM2-135M, a Llama).

Role: :func:`shape_config` returns a transformers config with the published
geometry; :meth:`oscarkv.models.llama.PagedLM.random` builds random weights from it (on the
GPU, in bfloat16), so attention and decode benchmarks run at real shapes.
"""

from __future__ import annotations

SHAPES = {
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True),
}
"""Geometry per name, as in the published ``config.json`` files (rope_theta 1e6, RMS eps 1e-6 for all;
Qwen3-32B: 64 query heads of 128, wider than its hidden size of 5120, tensor-parallel at 2-8 GPUs).

NOTE: ``max_position_embeddings`` is 131072, the YaRN-extended length of the Qwen3 model cards
(the published configs say 40960), so that the engine admits the 100K-token benchmark prompts;
no rope scaling is applied — with random weights only the shapes matter. ``smollm2-135m`` is the embedded default
model's geometry (a ``LlamaConfig``: rope_theta 1e5, RMS eps 1e-5, 8192 positions): its steps cost what the served
default model's do, without carrying its weights to a GPU."""
_LLAMA = {"smollm2-135m"}


def shape_config(name: str):
    """The ``Qwen3Config`` (``LlamaConfig`` for the default model's shape) of a name in :data:`SHAPES`."""
    from transformers import LlamaConfig, Qwen3Config

    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose from {sorted(SHAPES)}")
    if name in _LLAMA:
        return LlamaConfig(**SHAPES[name], rms_norm_eps=1e-5, rope_theta=1e5, max_position_embeddings=8192,
                           architectures=["LlamaForCausalLM"])
    return Qwen3Config(**SHAPES[name], rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=131072,
                       architectures=["Qwen3ForCausalLM"])
