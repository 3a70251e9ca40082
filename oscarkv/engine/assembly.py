"""How an engine's runner and KV codec are put together from a paged model, a config and an artifact.

Role: :func:`build_runner_and_codec` validates the artifact against the model's fingerprint, builds the
per-layer codecs, picks the attention backend and the CUDA-graph buckets, and returns the runner — a
:class:`~oscarkv.engine.model_runner.ModelRunner`, or a :class:`~oscarkv.engine.workers.ParallelRunner`
with ``cfg.tensor_parallel_size > 1`` — beside the codec. :class:`~oscarkv.engine.engine.LLMEngine` is built
from these (``LLMEngine.from_paged``), as is a benchmark's wrapped runner (``oscarkv.bench.e2e``).
"""

from __future__ import annotations

import torch

from oscarkv.attention.backends import default_backend
from oscarkv.attention.step import AttentionBackend
from oscarkv.config import EngineConfig
from oscarkv.engine.cuda_graphs import DEFAULT_BUCKETS
from oscarkv.engine.runner_build import build_runner
from oscarkv.engine.runner import Runner
from oscarkv.engine.workers import ParallelRunner
from oscarkv.models.llama import PagedLM
from oscarkv.models.moe import SparseMoE
from oscarkv.quant.artifact import ModelFingerprint
from oscarkv.quant.bpe import SlidingLayers
from oscarkv.quant.codec import KVCodec, build_codec


def build_runner_and_codec(model: PagedLM, cfg: EngineConfig, artifact=None, backend: AttentionBackend | None = None,
                           cuda_graphs: bool = True, device: torch.device | None = None) -> tuple[Runner, KVCodec]:
    """What :meth:`LLMEngine.from_paged` builds an engine from (its arguments, as there): the runner — a
    :class:`ModelRunner`, or a :class:`ParallelRunner` with ``cfg.tensor_parallel_size > 1`` — and the KV
    codec. A caller that wraps the runner (``oscarkv.bench.e2e.BenchRunner``) builds ``LLMEngine`` from these."""
    config = model.config
    fp = ModelFingerprint.from_config(config)
    if artifact is not None:
        artifact.validate(fp)
    codec = build_codec(cfg.kv, fp.num_layers, fp.num_kv_heads, fp.head_dim, artifact, SlidingLayers.from_config(config))
    here = next(model.parameters()).device
    if device is not None and cfg.tensor_parallel_size == 1 and torch.device(device).type != here.type:
        raise ValueError(f"device={device}: a single-device engine runs where its model is ({here}); move the model")
    backend = backend or default_backend(torch.device(device) if device is not None else here)
    if codec.sliding and cfg.tensor_parallel_size > 1:
        raise ValueError(f"{config.architectures[0]} has sliding-window layers: tensor parallelism is not supported")
    buckets = graph_buckets(model, codec, backend, cuda_graphs)
    if cfg.piecewise_graph_buckets and here.type == "cuda" and _sparse(model):
        raise ValueError("--piecewise-graph-buckets (EngineConfig.piecewise_graph_buckets): a mixture-of-experts "
                         "model sizes its expert buffers on the host each step, which a CUDA graph cannot capture; "
                         "leave it unset")
    if cfg.tensor_parallel_size > 1:
        runner = ParallelRunner(model, codec, cfg, backend, buckets, device)
    else:
        runner = build_runner(model, list(codec.layers), cfg, backend, buckets)
    return runner, codec


def graph_buckets(model: PagedLM, codec: KVCodec, backend: AttentionBackend, cuda_graphs: bool) -> tuple[int, ...]:
    """The decode graphs' batch buckets (the extend graphs, the pieces and the start-up builds follow them), or none:
    a sliding layer's band runs eagerly (``oscarkv.attention.step``) and a mixture-of-experts layer sizes its
    buffers from the step's routing on the host (``oscarkv.models.moe``): such models run without graphs."""
    return DEFAULT_BUCKETS if cuda_graphs and backend.decode_steps and not codec.sliding and not _sparse(model) else ()


def _sparse(model: PagedLM) -> bool:
    return any(isinstance(layer.mlp, SparseMoE) for layer in model.model.layers)


def eos_ids(config, tokenizer) -> tuple[int, ...]:
    ids = getattr(config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(sorted(set(ids)))
