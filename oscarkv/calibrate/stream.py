"""Layer-streamed calibration forwards: a model larger than the compute device, one decoder layer at a time.

Role: the ``CalibrationConfig.stream_layers`` alternative to :func:`~oscarkv.calibrate.stats.run_forward`.
Every batch is embedded on the host first; the hidden states of all batches (``[B, T, hidden]`` each,
in the model dtype) stay on the host. Then decoder layer ``i`` alone is materialized on the compute
device (its weights copied from the host), runs every batch through the calibration attention (so
the observer sees each layer's ``q``, ``k``, ``v`` and outputs exactly as the whole-model forward
shows them), and is freed before layer ``i + 1``. The final norm and the head are never run: the
statistics need none of them.

Data owned: :class:`LayerStream` holds the decoder layers' host tensors while the model's own
layers sit on the ``meta`` device; it hands every tensor back when the pass ends, so the model is
whole again for whatever runs next (the recipe search, evaluation).

NOTE (same artifact): the per-layer observation order is the same as the whole-model path (chunk
0, 1, ... for each layer), each layer computes the same expressions on the same inputs, and the
rotary tables are the model's own: the statistics, hence the artifact, are bit-for-bit those of
:func:`~oscarkv.calibrate.stats.run_forward` on the same device.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from tqdm.auto import tqdm

from oscarkv.calibrate.stats import Observer, calibration_mode

STREAMABLE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM")
"""Architectures whose backbone is embeddings → decoder layers (``model.model.layers``) → norm, with
one rotary table per layer type, as :func:`stream_forward` replays it."""


def check_streamable(config) -> str:
    """The config's architecture if :func:`stream_forward` can run it, else ``ValueError`` naming it."""
    arch = (config.architectures or [None])[0]
    if arch not in STREAMABLE:
        raise ValueError(f"--stream-layers does not support {arch}: streamed calibration runs "
                         f"{', '.join(STREAMABLE)}; calibrate {arch} without it")
    return arch


def _assign(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Point ``module``'s parameters and buffers (dotted names) at ``tensors``, without copying."""
    for name, t in tensors.items():
        owner, _, leaf = name.rpartition(".")
        sub = module.get_submodule(owner)
        if leaf in sub._parameters:  # the host's own Parameter objects come back as they were
            sub._parameters[leaf] = t if isinstance(t, torch.nn.Parameter) else torch.nn.Parameter(t, requires_grad=False)
        else:
            sub._buffers[leaf] = t


class LayerStream:
    """The decoder layers of a model, kept on the host with at most one on the compute device."""

    def __init__(self, layers: torch.nn.ModuleList, device: torch.device):
        self.layers, self.device = layers, device
        self.host = [dict(layer.named_parameters()) | dict(layer.named_buffers()) for layer in layers]
        for layer, tensors in zip(layers, self.host):
            _assign(layer, {name: t.to("meta") for name, t in tensors.items()})

    @contextmanager
    def resident(self, index: int) -> Iterator[torch.nn.Module]:
        """Layer ``index`` with its weights on the compute device; back on ``meta`` afterwards."""
        layer, host = self.layers[index], self.host[index]
        _assign(layer, {name: t.to(self.device) for name, t in host.items()})
        try:
            yield layer
        finally:
            _assign(layer, {name: t.to("meta") for name, t in host.items()})

    def restore(self) -> None:
        """Give every layer its host tensors back (the model is whole again)."""
        for layer, host in zip(self.layers, self.host):
            _assign(layer, host)


def _rotary_table(model: torch.nn.Module, hidden: torch.Tensor, positions: torch.Tensor,
                  layer_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` for one layer, as the backbone's forward computes them (Gemma 3: per layer type)."""
    if check_streamable(model.config) == "Gemma3ForCausalLM":
        return model.model.rotary_emb(hidden, positions, layer_type)
    return model.model.rotary_emb(hidden, positions)


@torch.inference_mode()
def stream_forward(model: torch.nn.Module, batches: Sequence[torch.Tensor], observer: Observer, desc: str,
                   device: torch.device | None = None) -> None:
    """:func:`~oscarkv.calibrate.stats.run_forward` one decoder layer at a time (module docstring).

    ``device`` runs the layers: by default the GPU when there is one, else the model's device."""
    check_streamable(model.config)
    backbone = model.model
    host = backbone.embed_tokens.weight.device
    device = device or torch.device("cuda" if torch.cuda.is_available() else host)
    hidden = [backbone.embed_tokens(ids.to(host)) for ids in batches]  # [B, T, hidden] each, model dtype
    n = len(backbone.layers)
    layer_types = getattr(model.config, "layer_types", None) or ["full_attention"] * n
    rotary = backbone.rotary_emb.to(device)
    positions = [torch.arange(h.shape[1], device=device)[None] for h in hidden]
    tables = {}  # (batch, layer type) -> (cos, sin): computed once, shared by the layers of that type
    stream = LayerStream(backbone.layers, device)
    try:
        with calibration_mode(model):
            for i in tqdm(range(n), desc=desc, unit="layer", leave=False):
                with stream.resident(i) as layer:
                    for b, h in enumerate(hidden):
                        h, key = h.to(device), (b, layer_types[i])
                        if key not in tables:
                            tables[key] = _rotary_table(model, h, positions[b], layer_types[i])
                        out = layer(h, attention_mask=None, position_embeddings=tables[key], position_ids=positions[b],
                                    cache=None, oscar_stats=observer)
                        hidden[b] = out.to(host)
    finally:
        stream.restore()
        rotary.to(host)
