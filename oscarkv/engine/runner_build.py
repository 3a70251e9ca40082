"""Build a :class:`~oscarkv.engine.model_runner.ModelRunner`: fold the value codecs into the model, size the pools,
attach the graphs a configuration asks for.

Role: :func:`build_runner` for the engine's assembly (``oscarkv.engine.assembly``) and each tensor-parallel rank
(``oscarkv.engine.workers``): a model's per-head key allocation permuted into contiguous head ranges
(:func:`split_heads`), its value codecs folded into its weights (in place), the pools planned for its KV heads
(one rank's with tensor parallelism; :func:`history_page_bytes`, the largest rank's history page), then the runner
with its decode, extend (:func:`extend_buckets`) and piecewise graphs (:func:`piece_buckets`) and the prefill's
cuDNN graphs warmed at start-up.
"""

from __future__ import annotations

import logging
import time

import torch

from oscarkv.attention.backends import TritonAttention
from oscarkv.attention.step import AttentionBackend, LayerStorage
from oscarkv.cache.kv_pools import HeadPart, KVPools, PoolGeometry, plan_pools
from oscarkv.config import PIECEWISE_BUCKETS, EngineConfig, prefetch_points
from oscarkv.engine.extend_graphs import ExtendGraphs
from oscarkv.engine.model_runner import ModelRunner
from oscarkv.engine.piecewise import PiecewiseGraphs
from oscarkv.models.folding import fold_values, permute_kv_heads
from oscarkv.models.llama import PagedLM
from oscarkv.models.parallel import TensorParallel
from oscarkv.models.prefetch import attach
from oscarkv.quant.bpe import SlidingLayers
from oscarkv.quant.codec import LayerCodec, TensorCodec

log = logging.getLogger(__name__)


def extend_buckets(cfg: EngineConfig) -> tuple[int, ...]:
    """``EngineConfig.extend_graph_buckets``, plus a verify step's ``1 + K`` tokens with speculation: a full verify
    chunk then replays a graph of its own size, not the next bucket padded (9 tokens in a graph of 16 cost the chunk
    kernel's 16-token grid: 0.145 against 0.119 ms a layer over 100K, H200, 2026-11-28)."""
    buckets, rows = set(cfg.extend_graph_buckets), 1 + cfg.speculative.num_speculative_tokens
    if cfg.speculative.enabled and buckets and rows < max(buckets):  # NOTE: longer chunks run eagerly anyway
        buckets.add(rows)
    return tuple(sorted(buckets))


def mixed_bucket(cfg: EngineConfig) -> int:
    """The piecewise bucket of a served mixed step (``EngineConfig.piecewise_batches``): a prompt chunk beside up to
    ``max_num_seqs`` decoding tokens, rounded up to 64 rows (a 512-token chunk and 32 decoders: 576). Without it
    every such step is one row over the 512 bucket and runs eagerly (one H200, 2026-11-28: 64 of 64 mixed steps)."""
    return -(-(cfg.prefill_chunk + min(cfg.max_num_seqs, cfg.max_num_batched_tokens - cfg.prefill_chunk)) // 64) * 64


def piece_buckets(cfg: EngineConfig, graphs: bool) -> tuple[int, ...]:
    """The piecewise buckets: ``EngineConfig.piecewise_graph_buckets``, unset: ``PIECEWISE_BUCKETS`` with CUDA
    ``graphs`` and no L2 prefetch; with ``piecewise_batches`` and chunks no longer than the largest bucket, the
    :func:`mixed_bucket` too (longer chunks run eagerly: an 8192-token chunk's bucket of 8256 held 2.8 GiB of
    buffers at Qwen3-8B's shape for steps whose GEMMs dwarf their launches)."""
    pieces = cfg.piecewise_graph_buckets
    if pieces is None:
        pieces = PIECEWISE_BUCKETS if graphs and cfg.l2_prefetch == "off" else ()
    if pieces and cfg.piecewise_batches and cfg.prefill_chunk <= max(pieces):
        pieces = tuple(sorted({*pieces, mixed_bucket(cfg)}))
    return tuple(pieces)


def _attach_pieces(runner: ModelRunner, cfg: EngineConfig, graphs: bool, one: bool) -> None:
    """The runner's piecewise graphs (``EngineConfig.piecewise_graph_buckets``; unset: ``PIECEWISE_BUCKETS`` with the
    decode graphs (``graphs``) and no L2 prefetch), captured now on ``one`` GPU. NOTE: without CUDA their steps run
    eagerly over the padded buffers (the tests); tensor-parallel ranks capture when rank 0 says, all at once (their
    all-reduces pair up: ``workers.ParallelRunner``; tokens ≡ tp 1 on two H200s, NCCL and ``one_shot_norm``)."""
    cuda = runner.device.type == "cuda"
    pieces = piece_buckets(cfg, graphs and cuda)
    if pieces:
        runner.piecewise = PiecewiseGraphs(runner, pieces, cfg.piecewise_batches)
        if cuda and one:  # at start-up, not in a served step (as the decode graphs)
            runner.piecewise.capture_all()


def _warm_prefill(runner: ModelRunner, cfg: EngineConfig) -> None:
    """Build the prefill attention's cuDNN graphs for cold prompts up to the model's length at start-up
    (:func:`oscarkv.kernels.prefill.warm_cudnn`), logging the count and the seconds. A failure is logged and
    left to the served steps (which build what they meet)."""
    from oscarkv.kernels.prefill import warm_cudnn

    attn, t = runner.model.model.layers[0].self_attn, time.perf_counter()
    longest = getattr(runner.model.config, "max_position_embeddings", None) or cfg.prefill_chunk
    shape = (attn.num_heads, attn.num_kv_heads, attn.head_dim, runner.pools.geo.page_size)
    try:
        n = warm_cudnn(shape, cfg.prefill_chunk, longest, runner.model.attention_scale, runner.device)
    except Exception:  # NOTE: a speed-up only; nothing served depends on it
        log.warning("oscarkv prefill attention: building cuDNN graphs at start-up failed", exc_info=True)
        return
    log.info("oscarkv prefill attention: %d cuDNN shapes built in %.1f s (prompts up to %d tokens)", n,
             time.perf_counter() - t, longest)


def build_runner(model: PagedLM, codecs: list[LayerCodec], cfg: EngineConfig, backend: AttentionBackend,
                 graph_buckets: tuple[int, ...] = (), tp: TensorParallel | None = None,
                 page_bytes: int = 0) -> ModelRunner:
    """Fold the value codecs into ``model`` (in place), size this device's pools from ``cfg`` for the
    model's KV heads (one rank's, with tensor parallelism; ``page_bytes``: the largest rank's history page,
    :func:`history_page_bytes`) and build the runner. Sliding-window layers
    store K/V as given (their codecs are replaced by the identity: a BF16 window, nothing to fold)."""
    p = next(model.parameters())
    sliding = SlidingLayers.from_config(model.config)
    codecs = split_heads(model, codecs)
    bf16 = TensorCodec(None, codecs[0].key.group)
    layers = [LayerStorage(bf16, bf16) if sliding and i in sliding.layers else LayerStorage(c.key, c.value).to(p.device)
              for i, c in enumerate(codecs)]
    values = fold_values(model, layers)
    storage = [LayerStorage(layer.key, v) for layer, v in zip(layers, values)]
    attn = model.model.layers[0].self_attn
    bits = (codecs[0].key.bits or 2, codecs[0].value.bits or 2)  # None: kv=bf16, no history pages
    geo = plan_pools(cfg, len(codecs), attn.num_kv_heads, attn.head_dim, codecs[0].key.group, p.dtype, bits, sliding,
                     layer_bits(codecs, sliding), layer_parts(codecs, sliding, attn.num_kv_heads), page_bytes)
    levels = {i: (st.key.levels, st.value.levels) for i, st in enumerate(storage)}
    pools = KVPools(geo, p.device, sliding.layers if sliding else frozenset(), levels)
    attach(model.model.layers, prefetch_points(cfg.l2_prefetch), cfg.l2_prefetch_mib << 20)  # after folding
    runner = ModelRunner(model, pools, storage, backend, graph_buckets, tp)
    if graph_buckets and cfg.extend_graph_buckets and p.device.type == "cuda" and isinstance(backend, TritonAttention):
        runner.extend_graphs = ExtendGraphs(runner, extend_buckets(cfg), greedy=cfg.speculative.enabled)
    _attach_pieces(runner, cfg, bool(graph_buckets), tp is None or tp.size == 1)
    if runner.extend_graphs is not None and runner.piecewise is not None and (tp is None or tp.size == 1):
        runner.extend_graphs.staged_buckets = runner.piecewise.buckets  # NOTE: ranks would have to capture together
    if graph_buckets and p.device.type == "cuda" and isinstance(backend, TritonAttention):
        _warm_prefill(runner, cfg)
    if cfg.speculative.enabled and (tp is None or tp.size == 1):
        # NOTE: verify steps take many bucket sizes (drafts shorter than K, draft_end near a demotion): captured
        # lazily, each would cost a served step a capture. Tensor-parallel ranks capture lazily, in step.
        runner.capture_graphs(1 + cfg.speculative.num_speculative_tokens)
    return runner


def split_heads(model: PagedLM, codecs: list[LayerCodec]) -> list[LayerCodec]:
    """Under a per-head key allocation (``TensorCodec.head_bits``), permute each such layer's KV heads in the model
    (:func:`~oscarkv.models.folding.permute_kv_heads`) and in its codecs so that the heads of one bit width form a
    contiguous range, 2-bit heads first (the order of ``head_parts``); other layers keep (or get back) their heads
    as loaded."""
    out = []
    for layer, c in zip(model.model.layers, codecs):
        if not c.key.head_bits:  # an engine built earlier from this model may have permuted them
            permute_kv_heads(layer.self_attn, list(range(layer.self_attn.num_kv_heads)))
            out.append(c)
            continue
        order = [h for heads, _ in c.key.head_parts() for h in heads]
        permute_kv_heads(layer.self_attn, order)
        out.append(LayerCodec(c.key.permute_heads(order), c.value.permute_heads(order)))
    return out


def layer_parts(codecs: list[LayerCodec], sliding: SlidingLayers | None,
                num_kv_heads: int) -> tuple[tuple[HeadPart, ...], ...]:
    """Each pool layer's head ranges (:func:`split_heads` made them contiguous) under a per-head allocation; empty
    without one."""
    rows = []
    for i, c in enumerate(codecs):
        if sliding and i in sliding.layers:
            continue
        vb, lo, parts = c.value.bits or 2, 0, []
        for heads, key in c.key.head_parts():
            n = len(heads) if heads is not None else num_kv_heads
            parts.append(HeadPart(lo, lo + n, (key.bits or 2, vb)))
            lo += n
        rows.append(tuple(parts))
    return tuple(rows) if any(len(r) > 1 for r in rows) else ()


def history_page_bytes(codecs: list[LayerCodec], config, num_kv_heads: int, page_size: int) -> int:
    """Bytes of one history page in every global layer of the pools :func:`build_runner` sizes for ``codecs``
    (a rank's KV heads ``num_kv_heads``; ``PoolGeometry.int2_page_bytes``): what tensor-parallel ranks compare."""
    sliding = SlidingLayers.from_config(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    n = len(codecs) - (len(sliding.layers) if sliding else 0)
    geo = PoolGeometry(n, num_kv_heads, head_dim, codecs[0].key.group, page_size, torch.bfloat16, 0, 0,
                       (codecs[0].key.bits or 2, codecs[0].value.bits or 2), layer_bits=layer_bits(codecs, sliding),
                       layer_parts=layer_parts(codecs, sliding, num_kv_heads))
    return geo.int2_page_bytes()


def layer_bits(codecs: list[LayerCodec], sliding: SlidingLayers | None) -> tuple[tuple[int, int], ...]:
    """Key and value bits of each pool layer (sliding layers left out) under a per-layer allocation; empty
    when every layer stores the same (the pools then hold one tensor per kind, as before allocations)."""
    bits = tuple((c.key.bits or 2, c.value.bits or 2) for i, c in enumerate(codecs)
                 if not (sliding and i in sliding.layers))
    return bits if len(set(bits)) > 1 else ()
