"""Real model shapes for benchmarks without weights: Qwen3-4B and Qwen3-8B configs.

Role: :func:`shape_config` returns a transformers ``Qwen3Config`` with the published
geometry; :meth:`oscarkv.models.llama.PagedLM.random` builds random weights from it (on the
GPU, in bfloat16), so attention and decode benchmarks run at real shapes.
"""

from __future__ import annotations

SHAPES = {
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}
"""Geometry per name (rope_theta 1e6, RMS eps 1e-6 for both).

NOTE: ``max_position_embeddings`` is 131072, the YaRN-extended length of the Qwen3 model cards
(the published configs say 40960), so that the engine admits the 100K-token benchmark prompts;
no rope scaling is applied — with random weights only the shapes matter."""


def shape_config(name: str):
    """The ``Qwen3Config`` of a name in :data:`SHAPES`."""
    from transformers import Qwen3Config

    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose from {sorted(SHAPES)}")
    return Qwen3Config(**SHAPES[name], rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=131072,
                       architectures=["Qwen3ForCausalLM"])
